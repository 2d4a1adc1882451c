"""The arms of a run, each resolved once into an `ArmSpec` that every engine reads the same way.

The variant's kv comes from the run's own composition; the baseline's (`baseline: bf16`) is composed by
Hydra from `conf/kv/<baseline>.yaml` exactly like a variant would be (defaults list, schema, resolvers
such as `${calibrated:tensor}`), so the two arms of a pair can never follow different rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from fp8eval.config import KVConfig, RunConfig
from fp8eval.core.errors import Fp8evalError
from fp8eval.core.paths import CONF_DIR


class ArmError(Fp8evalError):
    """An arm cannot be resolved (an unknown baseline option, ...); the message lists the valid ones."""


@dataclass(frozen=True)
class ArmSpec:
    """One arm: its kv option and the vLLM engine args it runs with (model < kv < engine, later wins).

    Engines take everything about the kv setting from here: `engine_args` (real vLLM `EngineArgs` names,
    `kv_cache_dtype` and `kv_cache_dtype_skip_layers` among them) and the scales fields. The field names
    mirror `KVConfig`'s so an engine reads `arm.name`, `arm.scales`, ... as it read the kv config."""

    kv: KVConfig
    role: str  # baseline | variant | single
    engine_args: dict[str, Any]

    @property
    def name(self) -> str:
        return self.kv.name

    @property
    def description(self) -> str:
        return self.kv.description

    @property
    def scales(self) -> str | None:
        return self.kv.scales

    @property
    def scale_strategy(self) -> str:
        return self.kv.scale_strategy

    @property
    def quantize_attention(self) -> bool:
        return self.kv.quantize_attention

    @property
    def attention(self) -> str:
        return self.kv.attention

    @property
    def accumulation(self) -> str:
        return self.kv.accumulation

    @property
    def kv_cache_dtype(self) -> str:
        """The cache dtype this arm asks for ("auto" = the model's dtype, i.e. BF16 here)."""
        return str(self.engine_args.get("kv_cache_dtype", "auto"))

    @property
    def skip_layers(self) -> list:
        """Layers whose cache stays in the model dtype: indices and/or "sliding_window"."""
        return list(self.engine_args.get("kv_cache_dtype_skip_layers") or [])


def merged_engine_args(cfg: RunConfig, kv: KVConfig) -> dict[str, Any]:
    """vLLM EngineArgs for an arm: model config, then kv config, then engine config (later wins)."""
    m = cfg.model
    args: dict[str, Any] = {"model": m.hf_id, "max_model_len": m.max_model_len,
                            "tensor_parallel_size": m.tensor_parallel_size}
    if m.revision:
        args["revision"] = m.revision
    for layer in (m.engine_args, kv.engine_args, cfg.engine.engine_args):
        args.update(_plain(layer))
    return args


def _plain(node) -> dict:
    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    return dict(node)


def compose_kv(name: str, model_name: str) -> KVConfig:
    """`conf/kv/<name>.yaml` composed by Hydra for `model_name` (its resolvers need the model)."""
    overrides = [f"kv={name}", f"model.name={model_name}"]
    try:
        if GlobalHydra.instance().is_initialized():
            cfg = compose(config_name="config", overrides=overrides)
        else:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose(config_name="config", overrides=overrides)
    except MissingConfigException:
        valid = sorted(p.stem for p in (CONF_DIR / "kv").glob("*.yaml"))
        raise ArmError(f"baseline={name!r} is not a kv option; valid: {', '.join(valid)}, none") from None
    kv = OmegaConf.to_object(cfg.kv)
    assert isinstance(kv, KVConfig)
    return kv


def resolve_arms(cfg: RunConfig) -> list[ArmSpec]:
    """[baseline, variant] (the baseline first, so pairing reads its records first), or one arm when
    `baseline` is none or the variant itself."""
    variant = cfg.kv if isinstance(cfg.kv, KVConfig) else OmegaConf.to_object(cfg.kv)
    baseline = cfg.baseline
    if baseline in (None, "none", "") or baseline == variant.name:
        role = "baseline" if baseline == variant.name else "single"
        return [ArmSpec(variant, role, merged_engine_args(cfg, variant))]
    base = compose_kv(baseline, cfg.model.name)
    return [ArmSpec(base, "baseline", merged_engine_args(cfg, base)),
            ArmSpec(variant, "variant", merged_engine_args(cfg, variant))]
