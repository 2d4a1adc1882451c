"""Hydra registration shared by every Hydra CLI: the model/kv/engine/task/suite schemas, our resolvers, and
`register_wing`, which each wing's `__main__` calls with its own schema (the wings are not known here).

It lives above `config` because it must know every task's config class and the calibration store.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from fp8eval.calibrate.store import latest_checkpoint
from fp8eval.config import (
    ControlConfig,
    EngineConfig,
    KVConfig,
    ModelConfig,
    RunConfig,
    StopConfig,
    SuiteConfig,
    TaskConfig,
)
from fp8eval.core.rundir import register_resolver as register_unique_dir
from fp8eval.models import model_card_name, model_card_value
from fp8eval.tasks import task_config_classes


def register_resolvers() -> None:
    """`${calibrated:tensor}` in a kv option = the latest calibrated checkpoint of the run's model."""

    def calibrated(strategy: str, *, _root_) -> str:
        return str(latest_checkpoint(str(_root_.model.name), strategy))

    if not OmegaConf.has_resolver("calibrated"):
        OmegaConf.register_new_resolver("calibrated", calibrated)
    # conf/model/hf.yaml: your own model's name, context and sampling defaults from its own files
    if not OmegaConf.has_resolver("model_card"):
        OmegaConf.register_new_resolver("model_card", model_card_value)
        OmegaConf.register_new_resolver("model_card_name", model_card_name)


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
    cs.store(group="schema/stop", name="stop", node=StopConfig)
    for name, cls in task_config_classes().items():
        cs.store(group="schema/task", name=name, node=cls)


def register_wing(schema: str, node: type, groups: dict[str, type] | None = None) -> None:
    """A wing's Hydra schema, registered the same way by every wing's `__main__`: the shared groups above,
    then `schema` (its top-level config, named in its conf/<wing>.yaml defaults) and any group schemas of its
    own (`{"schema/calib/calib": CalibConfig}`)."""
    register_configs()
    cs = ConfigStore.instance()
    cs.store(name=schema, node=node)
    for path, cls in (groups or {}).items():
        group, _, name = path.rpartition("/")
        cs.store(group=group, name=name, node=cls)
