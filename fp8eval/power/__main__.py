"""`python -m fp8eval.power`: samples x repeats a paired comparison needs, the planned run's MDE, and its cost.

    python -m fp8eval.power task=aime25 power.delta=3
    python -m fp8eval.power suite=reasoning power.recovery_floor=97
    python -m fp8eval.power task=niah power.delta=5 power.pilot=[outputs/runs]

Writes power.json into its run dir and prints the run dir last.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from fp8eval.core.secrets import redact_obj
from fp8eval.power.config import PowerRunConfig
from fp8eval.registry import register_wing
from fp8eval.wing import hydra_wing


def register() -> None:
    """ConfigStore: the shared groups and `power_schema` (conf/power.yaml): `python -m fp8eval`'s plus `power`."""
    register_wing("power_schema", PowerRunConfig)


register()


def run_wing(typed: PowerRunConfig, run_dir: Path) -> None:
    """Plan every task of the config, print the plans and the run dir (a question it cannot answer: one line,
    exit 2)."""
    from fp8eval.power.planner import format_plans, plan_all

    plans = plan_all(typed)
    print(format_plans(plans, typed.power.alpha, typed.power.power))
    run_dir.mkdir(parents=True, exist_ok=True)
    out = {"alpha": typed.power.alpha, "power": typed.power.power,
           "tasks": [{**{k: v for k, v in dataclasses.asdict(t).items() if k != "variance"},
                      "variance": dataclasses.asdict(t.variance), "mde_pts": 100 * t.mde,
                      "delta_pts": 100 * t.delta} for t in plans]}
    (run_dir / "power.json").write_text(json.dumps(redact_obj(out), indent=2, default=str) + "\n", encoding="utf-8")
    print(run_dir)


main = hydra_wing("fp8eval.power", "power", run_wing)


if __name__ == "__main__":
    main()
