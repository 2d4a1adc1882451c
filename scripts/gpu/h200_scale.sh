#!/usr/bin/env bash
# Issue 14 on a GPU (about 4 minutes): engine.attention_backend on the installed vLLM, end to end.
#   source /tmp/g/env.sh && bash scripts/gpu/h200_scale.sh        # from the project root; writes $OUT/scale.json
# 1. whether this vLLM's EngineArgs has `attention_backend` (else fp8eval passes VLLM_ATTENTION_BACKEND);
# 2. SmolLM2-135M, kv=fp8 alone, a 3-prompt NIAH, once per backend (FLASH_ATTN, TRITON_ATTN, then
#    FLASHINFER, which this bundle lacks: a clear refusal is the expected result); each run's
#    arms.fp8.attention_backend (requested / observed / verified) and recovery-free score are collected.
# Every step is time-boxed and a failure moves on to the next one. VLLM_EXTRA is appended to each run's overrides
# (e.g. engine_args for a GPU shared with other jobs).
set -u
OUT=${OUT:-$PWD/outputs/h200_scale}
mkdir -p "$OUT"
PY=${PYTHON:-python}
WORK=$(mktemp -d)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

timeout 120 "$PY" -c "import sys; from fp8eval.engines.attention import has_engine_arg; print(int(has_engine_arg(sys.executable)))" \
  > "$WORK/probe.txt" 2> "$WORK/probe.err" || echo "probe failed: $(tail -1 "$WORK/probe.err")"

for backend in FLASH_ATTN TRITON_ATTN FLASHINFER; do
  limit=150; [ "$backend" = FLASHINFER ] && limit=90
  timeout "$limit" "$PY" -m fp8eval model=smollm2-135m engine=vllm kv=fp8 baseline=none task=niah \
    'task.lengths=[1024]' 'task.depths=[0,50,100]' engine.attention_backend="$backend" report=false \
    progress=false records_dir="$WORK/records" hydra.run.dir="$WORK/run-$backend" ${VLLM_EXTRA:-} \
    > "$WORK/$backend.out" 2> "$WORK/$backend.err"
  echo "$?" > "$WORK/$backend.rc"
done

"$PY" - "$WORK" "$OUT/scale.json" <<'PY'
import json, pathlib, sys
work, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
probe = (work / "probe.txt").read_text().strip() if (work / "probe.txt").exists() else None
res = {"engine_arg_supported": probe, "runs": {}}
for b in ("FLASH_ATTN", "TRITON_ATTN", "FLASHINFER"):
    rc = (work / f"{b}.rc").read_text().strip() if (work / f"{b}.rc").exists() else None
    summ = work / f"run-{b}" / "summary.json"
    entry = {"rc": rc}
    if summ.exists():
        arm = json.loads(summ.read_text())["arms"]["fp8"]
        entry.update(attention_backend=arm.get("attention_backend"), score=arm.get("score"),
                     n_records=arm.get("n_records"), warnings=arm.get("engine_warnings"))
    else:
        err = (work / f"{b}.err").read_text(errors="replace").strip().splitlines() if (work / f"{b}.err").exists() else []
        entry["error_tail"] = err[-3:]
    res["runs"][b] = entry
out.write_text(json.dumps(res, indent=2) + "\n")
print(f"engine arg supported: {probe}")
for b, e in res["runs"].items():
    ab = e.get("attention_backend") or {}
    print(f"{b:12s} rc={e['rc']} observed={ab.get('observed')} verified={ab.get('verified')} "
          f"score={e.get('score')} {'' if 'error_tail' not in e else e['error_tail'][-1:]}")
PY
