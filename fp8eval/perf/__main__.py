"""`python -m fp8eval.perf`: latency sweep, fits, break-even, throughput, KV capacity per arm.

Prints the table, then the run directory as the last stdout line (perf.json and the plots are there).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from fp8eval.core.paths import CONF_DIR, display_path
from fp8eval.core.secrets import guard_std_streams
from fp8eval.perf.config import PerfRunConfig
from fp8eval.registry import register_wing


def register() -> None:
    """ConfigStore: the shared groups and `perf_schema` (conf/perf.yaml)."""
    register_wing("perf_schema", PerfRunConfig)


register()


@hydra.main(config_path=str(CONF_DIR), config_name="perf", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """`python -m fp8eval.perf`: run the sweep, print the table and the run directory; exit 2 when no arm measured
    anything."""
    from fp8eval.perf.run import run
    from fp8eval.perf.table import format_table

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    from fp8eval.core.errors import Fp8evalError

    typed = OmegaConf.to_object(cfg)
    try:
        result = run(typed, run_dir, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    except Fp8evalError as e:
        print(f"\nfp8eval.perf: {e}", file=sys.stderr)
        sys.exit(2)
    print()
    print(format_table(result))
    print(display_path(run_dir))
    measured = [a for a in result["arms"].values() if any(p.get("n") for p in a.get("points") or [])]
    if not measured:  # every arm failed to start, or every request failed: say so in the exit status
        sys.exit(2)


if __name__ == "__main__":
    guard_std_streams()  # every line printed, Hydra's errors included, is redacted (fp8eval.core.secrets)
    main()
