"""Engines turn chat requests into completions. They know nothing of tasks."""

from __future__ import annotations

import importlib

from fp8eval.config import KVConfig, RunConfig
from fp8eval.engines.attention import validate as validate_backend
from fp8eval.engines.base import Engine, EngineError

# kind -> "module:Class"; imported only when that kind is used (vLLM and torch are heavy).
ENGINES: dict[str, str] = {
    "fake": "fp8eval.engines.fake:FakeEngine",
    "reference": "fp8eval.engines.reference:ReferenceEngine",
    "vllm": "fp8eval.engines.vllm_offline:VLLMOfflineEngine",
    # One URL or a managed server: ServerEngine; several URLs for an arm: a replica pool.
    "server": "fp8eval.engines.pool:build_server_engine",
}


def engine_args(cfg: RunConfig, kv: KVConfig) -> dict:
    """vLLM EngineArgs for an arm: model config, then kv config, then engine config (later wins)."""
    m = cfg.model
    args: dict = {"model": m.hf_id, "max_model_len": m.max_model_len, "tensor_parallel_size": m.tensor_parallel_size}
    if m.revision:
        args["revision"] = m.revision
    for layer in (m.engine_args, kv.engine_args, cfg.engine.engine_args):
        args.update(dict(layer))
    if cfg.engine.attention_backend:  # its EngineArgs name; older vLLM gets it as an environment variable
        args["attention_backend"] = validate_backend(cfg.engine.attention_backend)
    return args


def resolve_kind(cfg: RunConfig) -> str:
    """`auto`: vLLM where it can run the model (installed, a CUDA GPU, weights it can load), else the
    reference engine. So `python -m fp8eval model=qwen3-30b kv=fp8` is one command on a GPU box and on a
    laptop, and the embedded GGUF models always take the reference engine."""
    kind = cfg.engine.kind
    if kind != "auto":
        return kind
    import importlib.util

    if cfg.model.embedded_package or importlib.util.find_spec("vllm") is None:
        return "reference"
    try:
        import torch

        return "vllm" if torch.cuda.is_available() else "reference"
    except ImportError:
        return "reference"


def build_engine(cfg: RunConfig, kv: KVConfig, shared: dict | None = None) -> Engine:
    kind = resolve_kind(cfg)
    if kind not in ENGINES:
        raise EngineError(f"unknown engine kind {kind!r}; valid: auto, {', '.join(sorted(ENGINES))}")
    module, _, cls = ENGINES[kind].partition(":")
    return getattr(importlib.import_module(module), cls)(cfg, kv, shared)
