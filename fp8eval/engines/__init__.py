"""Engines turn chat requests into completions. They know nothing of tasks."""

from __future__ import annotations

import importlib

from fp8eval.config import KVConfig, RunConfig
from fp8eval.engines.base import Engine, EngineError

# kind -> "module:Class"; imported only when that kind is used (vLLM and torch are heavy).
ENGINES: dict[str, str] = {
    "fake": "fp8eval.engines.fake:FakeEngine",
    "reference": "fp8eval.engines.reference:ReferenceEngine",
}


def engine_args(cfg: RunConfig, kv: KVConfig) -> dict:
    """vLLM EngineArgs for an arm: model config, then kv config, then engine config (later wins)."""
    m = cfg.model
    args: dict = {"model": m.hf_id, "max_model_len": m.max_model_len, "tensor_parallel_size": m.tensor_parallel_size}
    if m.revision:
        args["revision"] = m.revision
    for layer in (m.engine_args, kv.engine_args, cfg.engine.engine_args):
        args.update(dict(layer))
    return args


def build_engine(cfg: RunConfig, kv: KVConfig, shared: dict | None = None) -> Engine:
    kind = cfg.engine.kind
    if kind not in ENGINES:
        raise EngineError(f"unknown engine kind {kind!r}; valid: {', '.join(sorted(ENGINES))}")
    module, _, cls = ENGINES[kind].partition(":")
    return getattr(importlib.import_module(module), cls)(cfg, kv, shared)
