"""Config defaults are said once: an option's YAML never repeats what its schema dataclass already says."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from fp8eval.config import EngineConfig, KVConfig, ModelConfig
from fp8eval.tasks import task_config_classes

CONF = Path(__file__).resolve().parents[1] / "conf"


def _schema(group: str, data: dict):
    if group != "task":
        return {"model": ModelConfig, "kv": KVConfig, "engine": EngineConfig}[group]
    refs = [d for d in data.get("defaults", []) if isinstance(d, str) and d.startswith("/schema/task/")]
    return task_config_classes().get(refs[0].split("/")[3].split("@")[0]) if refs else None


@pytest.mark.parametrize("path", sorted(p for g in ("model", "kv", "engine", "task") for p in (CONF / g).glob("*.yaml")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_yaml_does_not_repeat_schema_defaults(path):
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    schema = _schema(path.parent.name, data)
    if schema is None:
        pytest.skip("no schema default to compare with")
    defaults = OmegaConf.to_container(OmegaConf.structured(schema), resolve=False)
    repeated = [k for k, v in data.items() if k != "defaults" and k in defaults and defaults[k] == v
                and defaults[k] != "???"]
    assert not repeated, f"{path.name} repeats its schema's defaults: {repeated}"
