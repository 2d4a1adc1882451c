#!/usr/bin/env bash
# Issue 17 on a GPU (estimate: 5-8 minutes, mostly three vLLM start-ups): task=lm_eval with engine=vllm.
#   source /tmp/g/env.sh && bash scripts/gpu/h200_lm_eval.sh     # from the project root; writes $OUT/lm_eval.json
# 1. fp8eval, SmolLM2-135M, both arms (bf16, fp8) on the test tasks: a generate_until task, a multiple_choice
#    task (vLLM prompt_logprobs) and lm-eval's gsm8k on six invented problems (tests/data/lm_eval/), offline;
# 2. lm-eval's own vLLM model (kv_cache_dtype=fp8) on the same documents, compared document by document with
#    the fp8 arm's records (scripts/gpu/lm_eval_compare.py): same primary metric, loglikelihood differences.
# Every step is time-boxed and a failure moves on to the next one. VLLM_EXTRA is appended to fp8eval's overrides
# (e.g. engine_args for a GPU shared with other jobs); LMEVAL_UTIL (default 0.5) is lm-eval's
# gpu_memory_utilization, LMEVAL_KVB (unset) its kv_cache_memory_bytes.
set -u
OUT=${OUT:-$PWD/outputs/h200_lm_eval}
mkdir -p "$OUT"
PY=${PYTHON:-python}
WORK=$(mktemp -d)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
DATA=$PWD/tests/data/lm_eval
TASKS="[fp8eval_toy,{task: gsm8k, num_fewshot: 2, dataset_path: json, dataset_name: null, dataset_kwargs: {data_files: {train: '$DATA/gsm8k_sample.jsonl', test: '$DATA/gsm8k_sample.jsonl'}}}]"

timeout 500 "$PY" -m fp8eval model=smollm2-135m engine=vllm kv=fp8 task=lm_eval "task.tasks=$TASKS" \
  task.include_path="$DATA" task.offline=true report=false progress=false records_dir="$WORK/records" \
  hydra.run.dir="$WORK/run" ${VLLM_EXTRA:-} > "$WORK/fp8eval.out" 2> "$WORK/fp8eval.err"
rc=$?; echo "fp8eval rc=$rc"; tail -15 "$WORK/fp8eval.out"; [ "$rc" != 0 ] && tail -25 "$WORK/fp8eval.err"
cp "$WORK/run/summary.json" "$OUT/summary.json" 2>/dev/null

MODEL_DIR=$("$PY" -c "
from omegaconf import OmegaConf
from fp8eval.config import ModelConfig
from fp8eval.models import local_model_dir
node = OmegaConf.load('conf/model/smollm2-135m.yaml'); node.pop('defaults', None)
print(local_model_dir(OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), node))))")
ARGS="{\"pretrained\": \"$MODEL_DIR\", \"kv_cache_dtype\": \"fp8\", \"dtype\": \"bfloat16\", \"max_model_len\": 8192, \"gpu_memory_utilization\": ${LMEVAL_UTIL:-0.5}${LMEVAL_KVB:+, \"kv_cache_memory_bytes\": $LMEVAL_KVB}}"
timeout 400 "$PY" scripts/gpu/lm_eval_compare.py "$WORK/run" fp8 "$OUT/lm_eval.json" --model vllm --model-args "$ARGS" \
  > "$WORK/compare.out" 2> "$WORK/compare.err"
echo "compare rc=$?"; cat "$WORK/compare.out" | tail -40; tail -5 "$WORK/compare.err"
