"""The arms of a run, each resolved once into an `ArmSpec` that every engine reads the same way.

The variant's kv comes from the run's own composition; the baseline's (`baseline: bf16`) is composed by
Hydra from `conf/kv/<baseline>.yaml` exactly like a variant would be (defaults list, schema, resolvers
such as `${calibrated:tensor}`), so the two arms of a pair can never follow different rules.
"""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from fp8eval.config import KVConfig, RunConfig
from fp8eval.core.errors import Fp8evalError
from fp8eval.core.paths import CONF_DIR
from fp8eval.engines.spec import ArmSpec, merged_engine_args

__all__ = ["ArmError", "ArmSpec", "compose_kv", "merged_engine_args", "resolve_arms"]


class ArmError(Fp8evalError):
    """An arm cannot be resolved (an unknown baseline option, ...); the message lists the valid ones."""


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
