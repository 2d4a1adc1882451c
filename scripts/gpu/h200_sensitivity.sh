#!/usr/bin/env bash
# Does the reference engine's recommended BF16 skip list also lower the divergence of vLLM's real FP8
# cache (index-based kv_cache_dtype_skip_layers)? Time-boxed (~3 min on one H200 with SmolLM2-135M):
#   1. python -m fp8eval.sensitivity on the reference engine (on the GPU) -> ranking + recommended layers;
#   2. python -m fp8eval.divergence engine=vllm: full FP8, the recommended layers in BF16, and as a control
#      the same number of the LEAST sensitive layers in BF16 (the BF16 arm is computed once and reused).
# Writes ONE file, $OUT/h200_sensitivity.json (ranking, skip lists, vLLM KL/top-1 per arm, each step's
# status and seconds), also when a step fails or the time box ends.
#
# Usage (GPU box, after ../shared/gpu's unpack.sh and `source /tmp/g/env.sh; cd /tmp/g/proj`):
#   OUT=/some/dir bash scripts/gpu/h200_sensitivity.sh
# Knobs: MODEL (smollm2-135m), LEN (2048 tokens), BUDGET_S (170), ENGINE (vllm; `reference` runs the
# same plumbing on a CPU box, which is how the script is tested), PY (python3).
set -uo pipefail
OUT=${OUT:?set OUT to the output directory}
MODEL=${MODEL:-smollm2-135m}
LEN=${LEN:-2048}
BUDGET_S=${BUDGET_S:-170}
ENGINE=${ENGINE:-vllm}
PY=${PY:-python3}
WORK=$(mktemp -d)
RECORDS="$WORK/records"
STEPS="$WORK/steps.jsonl"
START=$(date +%s)
mkdir -p "$OUT"
: >"$STEPS"
export PYTHONUNBUFFERED=1

left() { echo $((BUDGET_S - ($(date +%s) - START))); }

# step NAME CMD...: runs CMD with what is left of the time box; records status, seconds, run dir.
step() {
  local name=$1; shift
  local t0 rc budget run_dir
  budget=$(left)
  if [ "$budget" -le 5 ]; then
    echo "{\"step\": \"$name\", \"status\": \"not run: time box spent\"}" >>"$STEPS"; return 1
  fi
  t0=$(date +%s)
  timeout "$budget" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
  rc=$?
  run_dir=$(tail -n 1 "$WORK/$name.out" 2>/dev/null)
  "$PY" - "$name" "$rc" "$(( $(date +%s) - t0 ))" "$run_dir" "$WORK/$name.err" >>"$STEPS" <<'PYEOF'
import json, sys
name, rc, secs, run_dir, err = sys.argv[1:]
tail = open(err, encoding="utf-8", errors="replace").read().strip().splitlines()[-3:]
print(json.dumps({"step": name, "rc": int(rc), "seconds": int(secs), "run_dir": run_dir,
                  "status": "ok" if rc == "0" else ("timed out" if rc == "124" else "failed"),
                  "stderr_tail": [] if rc == "0" else tail}))
PYEOF
  echo "$run_dir" >"$WORK/$name.dir"
  [ "$rc" -eq 0 ]
}

step sensitivity "$PY" -m fp8eval.sensitivity model="$MODEL" engine=reference "sensitivity.lengths=[$LEN]" \
  sensitivity.progress=false
SENS_DIR=$(cat "$WORK/sensitivity.dir" 2>/dev/null)
# The recommended layers and, as a control, as many of the least sensitive ones.
read -r REC LEAST < <("$PY" - "$SENS_DIR/sensitivity.json" <<'PYEOF' 2>/dev/null
import json, sys
r = json.load(open(sys.argv[1]))
rec = r["recommended_skip_layers"]
least = sorted(r["ranking"][::-1][:len(rec)])
print(",".join(map(str, rec)) or "none", ",".join(map(str, least)) or "none")
PYEOF
)
DIV=("$PY" -m fp8eval.divergence model="$MODEL" engine="$ENGINE" "divergence.lengths=[$LEN]" records_dir="$RECORDS"
     divergence.plot=false)
step vllm_full_fp8 "${DIV[@]}" kv=fp8
if [ -n "${REC:-}" ] && [ "$REC" != none ]; then
  step vllm_skip_recommended "${DIV[@]}" kv=fp8 "++kv.engine_args.kv_cache_dtype_skip_layers=[$REC]"
  step vllm_skip_least "${DIV[@]}" kv=fp8 "++kv.engine_args.kv_cache_dtype_skip_layers=[$LEAST]"
fi

"$PY" - "$STEPS" "$WORK" "$OUT/h200_sensitivity.json" "$MODEL" "$LEN" "$ENGINE" "${REC:-}" "${LEAST:-}" <<'PYEOF'
import json, sys
from pathlib import Path
steps_path, work, out, model, length, engine, rec, least = sys.argv[1:]
steps = [json.loads(l) for l in open(steps_path) if l.strip()]
result = {"model": model, "length": int(length), "engine": engine, "steps": steps,
          "recommended_skip_layers": rec, "least_sensitive_control": least}
for s in steps:
    d = Path(s.get("run_dir") or "/nonexistent")
    if s["step"] == "sensitivity" and (d / "sensitivity.json").is_file():
        r = json.loads((d / "sensitivity.json").read_text())
        result["reference"] = {k: r.get(k) for k in ("ranking", "recommended_skip_layers", "kl_full_fp8",
                                                      "kl_with_skip", "removed_share", "kv_bytes_ratio",
                                                      "attention")}
        result["reference"]["kl_only_this"] = [l["kl_only_this"] for l in r["layers"]]
    elif (d / "divergence.json").is_file():
        r = json.loads((d / "divergence.json").read_text())
        result[s["step"]] = {"overall": r.get("overall"), "buckets": r.get("buckets")}
full = (result.get("vllm_full_fp8") or {}).get("overall") or {}
for name in ("vllm_skip_recommended", "vllm_skip_least"):
    o = (result.get(name) or {}).get("overall") or {}
    if full.get("kl_mean") and o.get("kl_mean") is not None:
        result[name]["removed_share"] = 1 - o["kl_mean"] / full["kl_mean"]
Path(out).write_text(json.dumps(result, indent=1) + "\n")
print(json.dumps({k: result.get(k, {}).get("removed_share") if isinstance(result.get(k), dict) else result.get(k)
                  for k in ("recommended_skip_layers", "vllm_skip_recommended", "vllm_skip_least")}))
PYEOF
rm -rf "$WORK"
