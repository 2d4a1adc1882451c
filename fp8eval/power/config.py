"""Typed config of `python -m fp8eval.power` (its Hydra schema, registered by its __main__)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fp8eval.config import RunConfig


@dataclass
class PowerConfig:
    # The target, one of: a drop in points of score (0-100) to detect, or a recovery floor % (the drop is
    # then (100 - floor)% of the baseline score: the distance from 100 % recovery to the gate).
    delta: Optional[float] = None
    recovery_floor: Optional[float] = None
    alpha: float = 0.05  # two-sided
    power: float = 0.8
    # The planned run; null: the task's own selection (its data size, grid, limit) and task.repeats.
    samples: Optional[int] = None
    repeats: Optional[int] = None
    # Pilot records: run dirs or folders holding them (python -m fp8eval outputs); null: priors only.
    pilot: Optional[list[str]] = None
    baseline_score: Optional[float] = None  # overrides the pilot's or the prior's baseline score (0-1)


@dataclass
class PowerRunConfig(RunConfig):
    """Everything `python -m fp8eval` composes (model, kv, engine, task or suite, plan.*) plus `power`."""

    power: PowerConfig = field(default_factory=PowerConfig)
