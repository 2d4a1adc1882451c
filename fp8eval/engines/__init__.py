"""Engines turn chat requests into completions. They know nothing of tasks."""

from __future__ import annotations

import importlib

from fp8eval.config import RunConfig
from fp8eval.engines.base import Capabilities, Engine, EngineError
from fp8eval.engines.spec import ArmSpec

# kind -> "module:Class" (imported only when that kind is used: vLLM and torch are heavy), or the class itself (an
# engine registered at run time, e.g. by a test). What a kind can do is its class's `capabilities`.
ENGINES: dict[str, object] = {
    "fake": "fp8eval.engines.fake:FakeEngine",
    "reference": "fp8eval.engines.reference:ReferenceEngine",
    "vllm": "fp8eval.engines.vllm_offline:VLLMOfflineEngine",
    # One URL or a managed server: ServerEngine; several URLs for an arm: a replica pool.
    "server": "fp8eval.engines.pool:build_server_engine",
}


def resolve_kind(cfg: RunConfig) -> str:
    """`auto`: vLLM where it can run the model (installed, a CUDA GPU, weights it can load), else the
    reference engine. So `python -m fp8eval model=qwen3-30b kv=fp8` is one command on a GPU box and on a
    laptop; without vLLM on a GPU the embedded models (and local model directories) take the reference engine."""
    kind = cfg.engine.kind
    if kind != "auto":
        return kind
    import importlib.util

    gpu, why = False, "vLLM is not installed"
    if importlib.util.find_spec("vllm") is not None:
        try:
            import torch

            gpu, why = torch.cuda.is_available(), "no CUDA GPU is visible"
        except ImportError:
            why = "torch is not installed"
    if gpu:  # the embedded models too: vLLM loads their GGUF converted to safetensors (fp8eval.models)
        return "vllm"
    if cfg.model.embedded_package or _is_local_dir(cfg.model.hf_id):
        return "reference"
    # A hub model (the 8B-1T models of conf/model/) on a machine that cannot run vLLM: the reference engine
    # would download and run it on the CPU for hours. Say so at once instead.
    raise EngineError(
        f"model={cfg.model.name} ({cfg.model.hf_id}) needs vLLM on a GPU, and here {why}. Use engine=vllm on a "
        "GPU machine, or engine=server with engine.base_url=http://HOST:PORT to evaluate a running "
        "OpenAI-compatible vLLM server; engine=reference runs it on this CPU only if asked for explicitly "
        "(practical for the embedded models: model=smollm2-135m, model=gemma3-270m).")


def _is_local_dir(path: str) -> bool:
    from pathlib import Path

    return Path(str(path)).expanduser().is_dir()


def build_engine(cfg: RunConfig, arm: ArmSpec, shared: dict | None = None, kind: str | None = None) -> Engine:
    """The engine for one arm (`kind` forces an engine kind, else `engine.kind` resolved). Every engine
    reads the kv setting from the ArmSpec only; `shared` lets the arms of a run share what does not depend
    on the arm (the reference engine's loaded model). Wings open engines through `fp8eval.arms`."""
    if not isinstance(arm, ArmSpec):
        raise TypeError(f"build_engine takes an ArmSpec, not {type(arm).__name__}: make one with "
                        "fp8eval.arms.arm_spec(cfg, kv) or fp8eval.arms.resolve_arms(cfg)")
    kind = kind or resolve_kind(cfg)
    cls = engine_class(kind)
    _say_format_notes(kind, arm)
    return cls(arm_config(cfg, arm), arm, shared)


def engine_class(kind: str):
    """The class (or factory) that builds engines of `kind`; EngineError naming the valid kinds for another."""
    if kind not in ENGINES:
        raise EngineError(f"unknown engine kind {kind!r}; valid: auto, {', '.join(sorted(ENGINES))}")
    target = ENGINES[kind]
    if not isinstance(target, str):
        return target
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def capabilities(cfg: RunConfig, kind: str | None = None) -> Capabilities:
    """What the run's engine kind (`kind`, else `engine.kind` with `auto` resolved) can do, before it starts."""
    return engine_class(kind or resolve_kind(cfg)).capabilities


def with_prefill_chunk(cfg: RunConfig, chunk: int | None, kind: str | None = None):
    """The engine group with prefills cut into `chunk` tokens, the way the engine kind chunks them (its
    `capabilities.prefill_chunking`); the group unchanged for chunk None or an engine that does not chunk."""
    import dataclasses

    how = capabilities(cfg, kind).prefill_chunking if chunk is not None else "none"
    e = dataclasses.replace(cfg.engine, engine_args=dict(cfg.engine.engine_args))
    if how == "engine":
        e.prefill_chunk = int(chunk)
    elif how == "scheduler":  # vLLM's scheduler budget: a prefill is cut at max_num_batched_tokens
        e.engine_args.update({"max_num_batched_tokens": int(chunk), "max_num_seqs": min(int(chunk), 128),
                              "enable_chunked_prefill": True})
    return e if how != "none" else cfg.engine


def with_topk(cfg: RunConfig, topk: int, kind: str | None = None) -> RunConfig:
    """The run config with the engine arg that caps per-position top-k raised to `topk` where the kind has one
    (vLLM's `max_logprobs`, 20 by default); the config itself otherwise (changed in place, as before)."""
    limit = capabilities(cfg, kind).topk_limit
    if limit is not None and int(topk) > limit[1]:
        args = dict(cfg.engine.engine_args)
        args.setdefault(limit[0], int(topk))
        cfg.engine.engine_args = args
    return cfg


def _early_kind(cfg: RunConfig, kind: str | None) -> str | None:
    """The arm's engine kind (`auto` resolved: vLLM on a GPU box), when it has a tokenizer-only worker
    (`capabilities.early_counter`)."""
    try:
        kind = kind or resolve_kind(cfg)
    except EngineError:  # the engine's own build says why
        return None
    return kind if kind in ENGINES and engine_class(kind).capabilities.early_counter else None


def prepare_early_counter(cfg: RunConfig, arm: ArmSpec, kind: str | None = None) -> bool:
    """The arm's model made loadable for the early worker (an embedded GGUF converted once: work of the engine's
    start-up); False when the preparation fails (the engine then says why), True otherwise (also when the kind has
    no early worker: nothing to prepare)."""
    kind = _early_kind(cfg, kind)
    if kind is None:
        return True
    try:
        worker = _early_worker(kind)
        worker.prepare(arm_config(cfg, arm), arm)
        return True
    except Exception:  # noqa: BLE001 - the engine's own start says what is wrong
        return False


def _early_worker(kind: str):
    module, _, name = engine_class(kind).capabilities.early_counter.partition(":")
    return getattr(importlib.import_module(module), name)


def prestart(cfg: RunConfig, arms: list[ArmSpec], shared: dict, kind: str | None = None) -> dict | None:
    """Start every arm's engine at once where the engine kind can and they fit (vLLM: fp8eval.engines.vllm.startup);
    the engines built later for these arms adopt what was started. What was done (None: nothing, the arms start
    one after the other)."""
    kind = kind or resolve_kind(cfg)
    if kind not in ENGINES or len(arms) < 2:
        return None
    return engine_class(kind).prestart([(arm_config(cfg, arm), arm) for arm in arms], shared)


def discard_prestarted(shared: dict) -> None:
    """Stop whatever `prestart` started that no engine adopted (the run ended before it reached that arm)."""
    if shared.get("vllm_prestarted"):  # imported by name, as the engines are (ENGINES)
        importlib.import_module("fp8eval.engines.vllm.startup").stop_prestarted(shared)


def start_early_counter(cfg: RunConfig, arm: ArmSpec, kind: str | None = None):
    """A tokenizer-only worker for the arm's engine, started now so that planning can count prompt tokens while
    the engine starts, where the engine kind (`auto` resolved) has one (`capabilities.early_counter`);
    else, or if it cannot start, None (planning then waits for the engine, as before)."""
    kind = _early_kind(cfg, kind)
    if kind is None:
        return None
    try:  # imported by name, as the engines are (ENGINES)
        return _early_worker(kind)(arm_config(cfg, arm), arm, None)
    except Exception:  # noqa: BLE001 - an optimisation only: the engine counts instead
        return None


def arm_config(cfg: RunConfig, arm: ArmSpec) -> RunConfig:
    """The run config an arm's engine is built with: the arm's own engine-group fields over the run's (a
    control arm's `prefill_chunk` or `concurrency`; fp8eval.control); the run's config itself otherwise."""
    if not arm.engine_overrides:
        return cfg
    import dataclasses

    from fp8eval.config import EngineConfig

    unknown = sorted(set(arm.engine_overrides) - {f.name for f in dataclasses.fields(EngineConfig)})
    if unknown:
        raise EngineError(f"arm {arm.name}: unknown engine field(s) {', '.join(unknown)}")
    return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, **arm.engine_overrides))


def _say_format_notes(kind: str, spec) -> None:
    """At start, once per format and process: the hardware a KV format needs that may be missing here, and the
    layers vLLM keeps in BF16 by itself (fp8eval.core.kvformats.start_notes)."""
    import sys

    from fp8eval.core.kvformats import start_notes

    dtype = str((getattr(spec, "engine_args", None) or {}).get("kv_cache_dtype", "auto"))
    key = (kind, dtype)
    if key in _NOTED:
        return
    _NOTED.add(key)
    for note in start_notes(dtype):
        print(f"kv format ({kind} engine): {note}", file=sys.stderr)


_NOTED: set = set()
