#!/usr/bin/env bash
# What the start-up changes of issue 34 cost and change, on one GPU, after scripts/gpu/smoke.sh has run with the same
# W (it reuses the smoke's side-by-side records of `engine=vllm`):
#
#   W=/tmp/smoke bash scripts/gpu/smoke.sh OUT && W=/tmp/smoke bash scripts/gpu/h200_startup.sh OUT
#
#   sequential   the default job with engine.parallel_start=false (the arms one after the other, each profiling its
#                own memory): its time, and its completions against the side-by-side run's, arm by arm
#   control      the default job with control=compiled: a BF16 arm with torch.compile + CUDA graphs beside the eager
#                BF16 baseline that engine.cuda_graphs=auto picks; the control's flips are the mode's effect
#   inproc       the default job with vLLM's engine core in the worker's process (VLLM_ENABLE_V1_MULTIPROCESSING=0):
#                its time, and its completions against the side-by-side run's
# STEPS (default "sequential control") picks them.
# Writes OUT/startup.json.
set -u
OUT=${1:?usage: h200_startup.sh OUT_DIR}
PY=${PY:-python3}
W=${W:?set W to the work dir of scripts/gpu/smoke.sh}
mkdir -p "$OUT"
one() {  # NAME LIMIT ARGS...: time one run of the default job
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s.%N)
  timeout -k 10 "$limit" "$PY" -m fp8eval engine=vllm "$@" "hydra.run.dir=$W/run_$name" > "$W/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$t0" "$(date +%s.%N)")" | tee -a "$W/startup.txt"
}
: > "$W/startup.txt"
for s in ${STEPS:-sequential control}; do
  case $s in
    sequential) one sequential 300 engine.parallel_start=false records_dir="$W/rec_seq" ;;
    control) one control 420 control=compiled records_dir="$W/rec_ctl" ;;
    # vLLM's engine core in the worker's own process (no second process importing vLLM)
    inproc) one inproc 300 +model.env.VLLM_ENABLE_V1_MULTIPROCESSING=0 records_dir="$W/rec_inproc" ;;
  esac
done
"$PY" - "$W" "$OUT/startup.json" <<'PY'
import glob, json, os, sys
w, out = sys.argv[1], sys.argv[2]
def completions(records_dir):
    got = {}
    for path in glob.glob(os.path.join(records_dir, "niah", "*.jsonl")):
        rows, kv = {}, "?"
        for line in open(path):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "sample_id" in r:
                rows[(r["sample_id"], r.get("repeat", 0))] = r.get("completion")
                kv = r.get("kv", kv)
        got[kv] = rows  # by the arm's kv name: the in-process run's fingerprints differ (model.env)
    return got
side = completions(os.path.join(w, "rec_vllm"))
doc = {"times": open(os.path.join(w, "startup.txt")).read().splitlines()}
for other in ("seq", "inproc"):
    seq = completions(os.path.join(w, f"rec_{other}"))
    if not seq:
        continue
    compare = {}
    for name in sorted(set(side) | set(seq)):
        a, b = side.get(name, {}), seq.get(name, {})
        keys = set(a) & set(b)
        compare[name] = {"pairs": len(keys), "same": sum(a[k] == b[k] for k in keys),
                                "only_side": len(set(a) - set(b)), "only_other": len(set(b) - set(a))}
    doc[f"side_by_side_vs_{other}"] = compare
def summary(run):
    try:
        return json.load(open(os.path.join(w, f"run_{run}", "summary.json")))
    except (OSError, ValueError):
        return None
for run in ("vllm", "sequential", "control", "inproc"):
    s = summary(run)
    if s:
        doc[run] = {"timing": s.get("timing"), "wall_s": s.get("wall_s"), "parallel_start": s.get("parallel_start"),
                    "verdict": (s.get("verdict") or {}).get("overall", {}).get("verdict"),
                    "control": s.get("control"),
                    "engine_args": {n: a.get("fingerprint") for n, a in (s.get("arms") or {}).items()}}
json.dump(doc, open(out, "w"), indent=1, default=str)
print(json.dumps({k: v for k, v in doc.items() if k.startswith("side")}, indent=1), doc["times"])
PY
