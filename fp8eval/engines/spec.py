"""ArmSpec: one arm's resolved kv setting, the only thing engines read about it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from fp8eval.config import KVConfig, RunConfig
from fp8eval.engines.attention import validate as validate_backend


@dataclass(frozen=True)
class ArmSpec:
    """One arm: its kv option and the vLLM engine args it runs with (model < kv < engine, later wins).

    Engines take everything about the kv setting from here: `engine_args` (real vLLM `EngineArgs` names,
    `kv_cache_dtype` and `kv_cache_dtype_skip_layers` among them, already merged: engines never merge again)
    and the scales and emulation fields. Made by `fp8eval.arms` (the one door), never by an engine."""

    kv: KVConfig
    role: str  # baseline | variant | single | arm
    engine_args: dict[str, Any]
    label: str = ""  # the arm's name when it is not the kv option's (a control arm: `bf16-variant`)

    @property
    def name(self) -> str:
        """The arm's name: its label, else the kv option's name (summary.json's key, `engine.base_urls`' key)."""
        return self.label or self.kv.name

    @property
    def scales(self) -> str | None:
        """The kv option's scales source (None: no scales)."""
        return self.kv.scales

    @property
    def scale_strategy(self) -> str:
        """The kv option's scale strategy."""
        return self.kv.scale_strategy

    @property
    def quantize_attention(self) -> bool:
        """The kv option's quantize_attention flag."""
        return self.kv.quantize_attention

    @property
    def attention(self) -> str:
        """The reference engine's FP8 attention emulation (kv_only | fa3_fp8 | qp_unit_scale)."""
        return self.kv.attention

    @property
    def accumulation(self) -> str:
        """The reference engine's P·V accumulation (exact | fast_fp8)."""
        return self.kv.accumulation


def merged_engine_args(cfg: RunConfig, kv: KVConfig) -> dict[str, Any]:
    """vLLM EngineArgs for an arm: model config, then kv config, then engine config (later wins)."""
    m = cfg.model
    args: dict[str, Any] = {"model": m.hf_id, "max_model_len": m.max_model_len,
                            "tensor_parallel_size": m.tensor_parallel_size}
    if m.revision:
        args["revision"] = m.revision
    for layer in (m.engine_args, kv.engine_args, cfg.engine.engine_args):
        args.update(_plain(layer))
    if getattr(cfg.engine, "attention_backend", None):  # its EngineArgs name; older vLLM: an env variable
        args["attention_backend"] = validate_backend(cfg.engine.attention_backend)
    return args


def _plain(node) -> dict:
    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    return dict(node)
