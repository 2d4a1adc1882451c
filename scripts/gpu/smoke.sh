#!/usr/bin/env bash
# GPU smoke test (issue 34): the README's GPU commands on one GPU, in about 5 minutes. Run it for every change that
# touches an engine; it fails loudly (exit 1, and FAIL on the step's line) when a command fails or a check on its
# summary.json does not hold. From the project root, with vLLM installed (or the offline bundle's env sourced):
#
#   bash scripts/gpu/smoke.sh OUT_DIR        # OUT_DIR gets smoke.json, smoke.md (the docs row) and smoke.log
#
# Steps (each time-boxed; a failed step never stops the next):
#   reference   engine=reference on CUDA, the default job cut to 512 tokens: the BF16 arm's decode on CUDA
#   auto        `python -m fp8eval`: engine=auto must take vLLM (FA3) on a GPU, both arms side by side
#   vllm        `python -m fp8eval engine=vllm` (fresh records: a second, warm start)
#   up          `python -m fp8eval.up`: the default job's arms as kept-alive vLLM servers (the warm path)
#   attach      `python -m fp8eval engine=server engine.keep_alive=true`: attaches to them, no vLLM start
#   down        `python -m fp8eval.up down`: stops them
#   kv_format   `engine=vllm kv=fp8_per_token_head`: a non-default KV format
#   headline    `model=qwen3-30b kv=fp8 engine=vllm` with dummy weights, a 2-length NIAH grid (needs the bundle's
#               MoE kernels: skipped, and said, without them)
# W (default a fresh temporary folder) holds records and run dirs; PY (default python3) the interpreter;
# SKIP_HEADLINE=1 leaves the headline out (its 61 GB of dummy weights take ~85 s).
set -u
OUT=${1:?usage: smoke.sh OUT_DIR}
PY=${PY:-python3}
W=${W:-$(mktemp -d /tmp/fp8eval-smoke.XXXXXX)}
mkdir -p "$OUT" "$W"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/smoke.log"
RESULTS="$W/results.jsonl"
: > "$RESULTS"
# The offline bundle's project has no .git (a git rev-parse there reads some other repository's): its BUNDLE.txt first.
if [[ -f ../BUNDLE.txt ]]; then COMMIT=$(head -1 ../BUNDLE.txt | cut -d' ' -f2 | cut -c1-7)
else COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown); fi
echo "smoke: commit $COMMIT, $(date -u +%FT%TZ), work dir $W" | tee "$LOG"

# step NAME TIMEOUT CHECK -- ARGS...: run `python -m fp8eval ARGS` with its own run dir, time it, check summary.json.
# CHECK is a Python expression over `s` (the summary) and `kinds` (the arms' engine kinds).
# With MOD=fp8eval.up (and CHECK "-") it runs that module instead and checks only its exit code.
step() {
  local name=$1 limit=$2 check=$3; shift 4
  local run="$W/run_$name" mod=${MOD:-fp8eval}
  local t0=$(date +%s.%N)
  if [[ "$mod" == fp8eval ]]; then set -- "$@" "hydra.run.dir=$run"; fi
  timeout -k 10 "$limit" "$PY" -m "$mod" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  local t1=$(date +%s.%N)
  "$PY" - "$name" "$rc" "$t0" "$t1" "$run/summary.json" "$check" "$*" "$mod" >> "$RESULTS" <<'PY'
import json, sys
name, rc, t0, t1, path, check, args, mod = sys.argv[1:]
row = {"step": name, "rc": int(rc), "seconds": round(float(t1) - float(t0), 1),
       "command": f"python -m {mod} " + args.replace(f" hydra.run.dir={path[:-len('/summary.json')]}", "")}
s = None
if check != "-":
    try:
        s = json.load(open(path))
    except (OSError, ValueError) as e:
        row["problem"] = f"no summary.json ({type(e).__name__})"
if s is not None:
    arms = s.get("arms") or {}
    kinds = {a.get("engine") for a in arms.values()}
    v = (s.get("verdict") or {}).get("overall") or {}
    row.update({"engines": sorted(k for k in kinds if k), "verdict": v.get("verdict"),
                "recovery": v.get("recovery"),
                "requests_sent": {n: a.get("requests_sent") for n, a in arms.items()},
                "parallel_start": bool(s.get("parallel_start")),
                "timing": {k: (s.get("timing") or {}).get(k) for k in ("wall_s", "engine_s", "harness_s")},
                "engine_parts": (s.get("timing") or {}).get("engine_parts")})
    try:
        ok = bool(eval(check, {}, {"s": s, "kinds": kinds, "arms": arms}))
    except Exception as e:  # noqa: BLE001
        ok, row["problem"] = False, f"check raised {type(e).__name__}: {e}"
    if not ok:
        row.setdefault("problem", f"check failed: {check}")
row["ok"] = row["rc"] == 0 and "problem" not in row
print(json.dumps(row))
PY
  local line
  line=$(tail -1 "$RESULTS")
  if [[ "$line" == *'"ok": true'* ]]; then echo "ok   $name: $line" | tee -a "$LOG"
  else echo "FAIL $name: $line" | tee -a "$LOG"; tail -25 "$W/$name.log" | tee -a "$LOG"; fi
}

ANY_VLLM='kinds == {"vllm"}'
step reference 240 'kinds == {"reference"} and all(a["n_samples"] > 0 for a in arms.values())' -- \
  engine=reference engine.device=cuda records_dir="$W/rec_ref" 'task.lengths=[512]'
step auto 300 "$ANY_VLLM and s.get('parallel_start')" -- records_dir="$W/rec_auto"
step vllm 240 "$ANY_VLLM" -- engine=vllm records_dir="$W/rec_vllm"
# The warm path: the arms' servers kept alive, a run that attaches to them, then stopped.
MOD=fp8eval.up step up 300 - --
step attach 180 "kinds == {'server'} and all(a['requests_sent'] > 0 for a in arms.values())" -- engine=server \
  engine.keep_alive=true records_dir="$W/rec_attach"
MOD=fp8eval.up step down 120 - -- down
step kv_format 240 "$ANY_VLLM" -- engine=vllm kv=fp8_per_token_head records_dir="$W/rec_kvf"
if [[ -n "${SKIP_HEADLINE:-}" ]]; then
  echo '{"step": "headline", "ok": true, "skipped": "SKIP_HEADLINE=1"}' >> "$RESULTS"
  echo "skip headline: SKIP_HEADLINE=1" | tee -a "$LOG"
elif "$PY" - <<'PY'
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("vllm")
root = pathlib.Path(spec.origin).parent if spec else None
sys.exit(0 if root and list(root.glob("_moe_C*")) else 1)
PY
then
  step headline 300 "$ANY_VLLM and s.get('dummy_weights')" -- model=qwen3-30b kv=fp8 engine=vllm model.dummy=true \
    records_dir="$W/rec_head" 'task.lengths=[1024,2048]' 'task.depths=[0,100]' anatomy=false
else
  echo '{"step": "headline", "ok": true, "skipped": "no MoE kernels in this vLLM (offline bundle without --with-moe)"}' >> "$RESULTS"
  echo "skip headline: no MoE kernels in this vLLM" | tee -a "$LOG"
fi

"$PY" - "$RESULTS" "$OUT" "$COMMIT" "$W" <<'PY'
import json, sys, datetime
out, commit, work = sys.argv[2], sys.argv[3], sys.argv[4]
rows = [json.loads(l.replace(work, "W")) for l in open(sys.argv[1]) if l.strip()]  # no machine paths in docs
try:
    import torch, vllm
    device, version = torch.cuda.get_device_name(0), vllm.__version__
except Exception:  # noqa: BLE001
    device, version = "unknown", "unknown"
doc = {"commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
       "device": device, "vllm": version, "ok": all(r.get("ok") for r in rows), "steps": rows}
json.dump(doc, open(f"{out}/smoke.json", "w"), indent=1)
lines = [f"Smoke test (scripts/gpu/smoke.sh) at commit {commit}, {doc['date']}, {device}, vLLM {version}: "
         + ("all steps ok" if doc["ok"] else "FAILED"), "",
         "| step | command | s | engines | verdict | recovery | requests sent | ok |", "|---|---|---|---|---|---|---|---|"]
for r in rows:
    if "skipped" in r:
        lines.append(f"| {r['step']} | skipped: {r['skipped']} | | | | | | - |")
        continue
    rec = r.get("recovery")
    lines.append(f"| {r['step']} | `{r['command']}` | {r['seconds']} | {', '.join(r.get('engines') or [])} | "
                 f"{r.get('verdict')} | {'' if rec is None else f'{rec:.1f} %'} | {r.get('requests_sent')} | "
                 f"{'yes' if r.get('ok') else 'NO: ' + r.get('problem', 'rc ' + str(r.get('rc')))} |")
open(f"{out}/smoke.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(0 if doc["ok"] else 1)
PY
