"""The task registry: name -> "module:Class". Modules are imported only when needed."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fp8eval.tasks.base import Task

REGISTRY: dict[str, str] = {
    "niah": "fp8eval.tasks.niah:NiahTask",
    "aime25": "fp8eval.tasks.aime:AimeTask",
    "aime24": "fp8eval.tasks.aime:Aime24Task",
    "aime": "fp8eval.tasks.aime:AimePooledTask",
    "math500": "fp8eval.tasks.math500:Math500Task",
    "gpqa_diamond": "fp8eval.tasks.gpqa:GpqaTask",
    "livecodebench": "fp8eval.tasks.livecodebench:LiveCodeBenchTask",
    "mrcr": "fp8eval.tasks.mrcr:MrcrTask",
    "lm_eval": "fp8eval.tasks.lm_eval:LmEvalTask",
}


def task_class(name: str) -> type["Task"]:
    """The Task class registered under `name`, importing its module now (KeyError listing the valid names)."""
    if name not in REGISTRY:
        raise KeyError(f"unknown task {name!r}; valid tasks: {', '.join(sorted(REGISTRY))}")
    module, _, cls = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def task_config_classes() -> dict[str, type]:
    """{task name: its config dataclass} for every registered task (imports every task module)."""
    return {name: task_class(name).config_class for name in REGISTRY}
