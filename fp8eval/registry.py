"""Hydra registration for every CLI: the typed schemas in ConfigStore and our resolvers.

It lives with the CLIs (not in `config`) because it must know every task's config class and the
calibration store, and `config` sits below both.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from fp8eval.calibrate.config import CalibConfig, CalibrateConfig
from fp8eval.calibrate.store import latest_checkpoint
from fp8eval.config import ControlConfig, EngineConfig, KVConfig, ModelConfig, RunConfig, SuiteConfig, TaskConfig
from fp8eval.core.rundir import register_resolver as register_unique_dir
from fp8eval.divergence.config import DivergenceRunConfig
from fp8eval.sensitivity.config import SensitivityRunConfig
from fp8eval.tasks import task_config_classes


def register_resolvers() -> None:
    """`${calibrated:tensor}` in a kv option = the latest calibrated checkpoint of the run's model."""

    def calibrated(strategy: str, *, _root_) -> str:
        return str(latest_checkpoint(str(_root_.model.name), strategy))

    if not OmegaConf.has_resolver("calibrated"):
        OmegaConf.register_new_resolver("calibrated", calibrated)


def register_configs() -> None:
    """Schemas for `python -m fp8eval` (and every CLI that composes model/kv/engine/task groups)."""
    register_resolvers()  # ${calibrated:<strategy>} in conf/kv/fp8_calibrated.yaml, fp8_per_head.yaml
    register_unique_dir()  # ${fp8eval_unique_dir:...} in hydra.run.dir
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    # Schemas live in their own group so `--help` lists only real options under model/, kv/, ...;
    # a YAML option extends one with `defaults: [/schema/<group>/<name>@_here_, _self_]`.
    cs.store(group="schema/model", name="model", node=ModelConfig)
    cs.store(group="schema/kv", name="kv", node=KVConfig)
    cs.store(group="schema/engine", name="engine", node=EngineConfig)
    cs.store(group="schema/task", name="task", node=TaskConfig)
    cs.store(group="schema/suite", name="suite", node=SuiteConfig)
    cs.store(group="schema/control", name="control", node=ControlConfig)
    for name, cls in task_config_classes().items():
        cs.store(group="schema/task", name=name, node=cls)


def register_calibrate_configs() -> None:
    """Schemas for `python -m fp8eval.calibrate` (model options extend /schema/model/model)."""
    register_configs()
    cs = ConfigStore.instance()
    cs.store(name="calibrate_schema", node=CalibrateConfig)
    cs.store(group="schema/calib", name="calib", node=CalibConfig)


def register_divergence_configs() -> None:
    """Schemas for `python -m fp8eval.divergence` (the model/kv/engine groups of `python -m fp8eval`)."""
    register_configs()
    ConfigStore.instance().store(name="divergence_schema", node=DivergenceRunConfig)


def register_sensitivity_configs() -> None:
    """Schemas for `python -m fp8eval.sensitivity` (the model/kv/engine groups of `python -m fp8eval`)."""
    register_configs()
    ConfigStore.instance().store(name="sensitivity_schema", node=SensitivityRunConfig)
