"""ArmSpec: one arm's resolved kv setting, the only thing engines read about it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fp8eval.config import KVConfig, RunConfig, plain
from fp8eval.engines.attention import validate as validate_backend


@dataclass(frozen=True)
class ArmSpec:
    """One arm: its kv option and the vLLM engine args it runs with (model < kv < engine, later wins).

    Engines take everything about the kv setting from here: `engine_args` (real vLLM `EngineArgs` names,
    `kv_cache_dtype` and `kv_cache_dtype_skip_layers` among them, already merged: engines never merge again)
    and the scales and emulation fields. Made by `fp8eval.arms` (the one door), never by an engine."""

    kv: KVConfig
    role: str  # baseline | variant | single | arm | control
    engine_args: dict[str, Any]
    label: str = ""  # the arm's name when it is not the kv option's (control arms: `bf16-variant`, `bf16-batch1`)
    # Environment variables of this arm's vLLM process only (a control arm's VLLM_BATCH_INVARIANT=1)
    env: dict[str, str] = field(default_factory=dict)
    # Added to the run's seed for this arm's per-(sample, repeat) seeds (a control arm's other seeds)
    seed_offset: int = 0
    # EngineConfig fields for this arm only, over the engine group (a control arm's prefill_chunk, concurrency);
    # applied by fp8eval.engines.build_engine
    engine_overrides: dict[str, Any] = field(default_factory=dict)

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
        """The reference engine's P·V accumulation (exact | fast_fp8 | fa3_unfixed)."""
        return self.kv.accumulation

    @property
    def int8_rounding(self) -> str:
        """The reference engine's int8_per_token_head rounding (half_away | trunc)."""
        return self.kv.int8_rounding

    @property
    def int4_rht(self) -> bool:
        """Whether the reference engine's int4_per_token_head rotates first."""
        return bool(self.kv.int4_rht)


def merged_engine_args(cfg: RunConfig, kv: KVConfig) -> dict[str, Any]:
    """vLLM EngineArgs for an arm: model config, then kv config, then engine config (later wins)."""
    m = cfg.model
    args: dict[str, Any] = {"model": m.hf_id, "max_model_len": m.max_model_len,
                            "tensor_parallel_size": m.tensor_parallel_size}
    if m.revision:
        args["revision"] = m.revision
    model_args = plain(m.engine_args)
    if getattr(m, "dummy", False):  # the architecture's config.json already carries the model's hf_overrides
        model_args.pop("hf_overrides", None)
    for layer in (model_args, plain(kv.engine_args), plain(cfg.engine.engine_args)):
        args.update(layer)
    if getattr(cfg.engine, "attention_backend", None):  # its EngineArgs name; older vLLM: an env variable
        args["attention_backend"] = validate_backend(cfg.engine.attention_backend)
    if getattr(m, "dummy", False):  # random weights of the model's architecture (fp8eval.models.dummy_engine_args)
        from fp8eval.models import dummy_engine_args

        args = dummy_engine_args(m, args)
    return args

