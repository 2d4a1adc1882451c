"""`python -m fp8eval.power`: samples x repeats a paired comparison needs, the planned run's MDE, and its cost.

    python -m fp8eval.power task=aime25 power.delta=3
    python -m fp8eval.power suite=reasoning power.recovery_floor=97
    python -m fp8eval.power task=niah power.delta=5 power.pilot=[outputs/runs]

Writes power.json into its run dir and prints the run dir last.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from fp8eval.core.errors import Fp8evalError
from fp8eval.core.secrets import guard_std_streams
from fp8eval.power.config import PowerRunConfig
from fp8eval.registry import register_wing
from fp8eval.validate import validate_config


def register() -> None:
    """ConfigStore: the shared groups and `power_schema` (conf/power.yaml): `python -m fp8eval`'s plus `power`."""
    register_wing("power_schema", PowerRunConfig)


register()


@hydra.main(config_path="../../conf", config_name="power", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Plan every task of the config, print the plans and the run dir; exit 2 on a question it cannot answer."""
    from fp8eval.power.planner import format_plans, plan_all

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    typed = OmegaConf.to_object(cfg)
    try:
        validate_config(typed)  # every wing's one check, before any pilot is read
        plans = plan_all(typed)
    except Fp8evalError as e:
        print(f"\nfp8eval.power: {e}", file=sys.stderr)
        sys.exit(2)
    print(format_plans(plans, typed.power.alpha, typed.power.power))
    run_dir.mkdir(parents=True, exist_ok=True)
    out = {"alpha": typed.power.alpha, "power": typed.power.power,
           "tasks": [{**{k: v for k, v in dataclasses.asdict(t).items() if k != "variance"},
                      "variance": dataclasses.asdict(t.variance), "mde_pts": 100 * t.mde,
                      "delta_pts": 100 * t.delta} for t in plans]}
    (run_dir / "power.json").write_text(json.dumps(out, indent=2, default=str) + "\n", encoding="utf-8")
    print(run_dir)


if __name__ == "__main__":
    guard_std_streams()  # every line printed, Hydra's --cfg and errors included, is redacted (fp8eval.core.secrets)
    main()
