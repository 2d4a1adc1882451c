#!/usr/bin/env bash
# Issue 26 on the H200 (budget: 3 minutes): the harness's share of a GPU run's time. Writes into $1.
#
#   source /tmp/g/env.sh; cd /tmp/g/proj
#   bash scripts/gpu/h200_harness_share.sh RESULTS_DIR
#
# Steps (each under its own `timeout`; a failed step never stops the next; whole script <= BUDGET_S):
#   run      python -m fp8eval engine=vllm model=smollm2-135m, niah 60-sample grid (4 lengths x 5 depths x 3
#            needles), both arms (fp8 and its bf16 baseline), fresh records: summary.json's "timing" splits the
#            runner's wall time into engine time (start-up, waiting for completions, close) and harness time
#            (planning and token counting, records, scoring, claims, summary); harness work done while an
#            engine call was in flight (planning during the first start, the summary during the last close)
#            is harness_overlapped_s, and harness_work_share = (harness_s + overlapped) / engine_s
#   profile  the same job again under cProfile with fresh records (only when >= 80 s are left): where the
#            harness's own time goes, top functions of the main process (vLLM runs in a child process)
# Writes $1/harness_share.json (the timing of each step, harness_share = harness_s / engine_s, the goal < 0.01),
# $1/harness_profile.txt (if the profile step ran) and $1/log_tail.txt.
# Runnable on a CPU box for a dry run: ENGINE=vllm_cpu GRID="task.lengths=[256] task.depths=[0,100]" BUDGET_S=600
set -u
set -f  # Hydra list overrides stay literal
OUT=${1:?usage: h200_harness_share.sh RESULTS_DIR}
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-175}
ENGINE=${ENGINE:-vllm}
GRID=${GRID:-"task.lengths=[1024,2048,4096,8000] task.depths=[0,25,50,75,100] task.needles_per_cell=3"}
WORK=${WORK:-$(mktemp -d /tmp/h200share.XXXXXX)}
mkdir -p "$OUT" "$WORK"
LOG="$WORK/run.log"
START=$(date +%s)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
echo "work dir: $WORK; budget ${BUDGET_S} s; engine=$ENGINE; $GRID" | tee -a "$LOG"

# step NAME MAX_SECONDS MIN_SECONDS_NEEDED CMD...
step() {
  local name=$1 max=$2 need=$3; shift 3
  local rest; rest=$(left)
  if (( rest < need )); then
    echo "== $name: skipped (${rest} s left, needs ${need})" | tee -a "$LOG"
    printf '%s\t-1\t0\tskipped\n' "$name" >> "$WORK/steps.tsv"
    return
  fi
  local t=$(( max < rest ? max : rest )) t0; t0=$(date +%s)
  echo "== $name (timeout ${t} s): $*" | tee -a "$LOG"
  timeout -k 10 "$t" "$@" > "$WORK/$name.out" 2>&1
  local rc=$?
  tail -n 40 "$WORK/$name.out" >> "$LOG"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" $(( $(date +%s) - t0 )) "$( ((rc == 124 || rc == 137)) && echo timed-out)" >> "$WORK/steps.tsv"
  echo "== $name: rc $rc in $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
}

JOB="model=smollm2-135m kv=fp8 engine=$ENGINE task=niah $GRID report=false progress=false"
# shellcheck disable=SC2086
step run "${RUN_S:-150}" 60 $PY -m fp8eval $JOB "records_dir=$WORK/records_run" "hydra.run.dir=$WORK/run"
# shellcheck disable=SC2086
step profile "${PROFILE_S:-110}" 80 $PY -m cProfile -o "$WORK/profile.pstats" -m fp8eval $JOB "records_dir=$WORK/records_profile" \
  "hydra.run.dir=$WORK/profile"

$PY - "$WORK" "$OUT" <<'PY' >> "$LOG" 2>&1
import json, pathlib, pstats, sys, io
work, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
steps = {}
for line in (work / "steps.tsv").read_text().splitlines() if (work / "steps.tsv").exists() else []:
    name, rc, secs, note = (line.split("\t") + [""])[:4]
    steps[name] = {"rc": int(rc), "seconds": int(secs), "note": note}
result = {"steps": steps, "goal": "harness_share = harness_s / engine_s < 0.01"}
for name in ("run", "profile"):
    p = work / name / "summary.json"
    if p.exists():
        s = json.loads(p.read_text())
        t = s.get("timing", {})
        gen = t.get("engine_parts", {}).get("generate")
        result[name] = {"timing": t, "wall_s": s.get("wall_s"),
                        "harness_share_of_generate": round(t["harness_s"] / gen, 6) if gen else None,
                        "arms": {k: {f: a.get(f) for f in ("score", "n_samples", "requests_sent", "n_errors",
                                                            "n_skipped", "fingerprint")}
                                 for k, a in s.get("arms", {}).items()},
                        "recovery": (s.get("recovery") or {}).get("overall")}
if (work / "profile.pstats").exists():
    buf = io.StringIO()
    st = pstats.Stats(str(work / "profile.pstats"), stream=buf)
    st.sort_stats("cumulative").print_stats(40)
    st.sort_stats("tottime").print_stats(30)
    (out / "harness_profile.txt").write_text(buf.getvalue()[-60000:])
(out / "harness_share.json").write_text(json.dumps(result, indent=2) + "\n")
run = result.get("run", {}).get("timing", {})
print(f"harness_share={run.get('harness_share')} harness_s={run.get('harness_s')} engine_s={run.get('engine_s')} "
      f"wall_s={run.get('wall_s')} (goal < 0.01); harness_overlapped_s={run.get('harness_overlapped_s')} "
      f"harness_work_share={run.get('harness_work_share')} plan={run.get('harness_parts', {}).get('plan')} "
      f"plan_check={run.get('harness_parts', {}).get('plan_check')}")
PY
tail -n 150 "$LOG" | tail -c 30000 > "$OUT/log_tail.txt"
tail -n 1 "$LOG"
echo "total $(( $(date +%s) - START )) s; work dir $WORK"
