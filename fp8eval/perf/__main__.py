"""`python -m fp8eval.perf`: latency sweep, fits, break-even, throughput, KV capacity per arm.

Prints the table, then the run directory as the last stdout line (perf.json and the plots are there).
"""

from __future__ import annotations

import sys
from pathlib import Path

from fp8eval.core.paths import display_path
from fp8eval.perf.config import PerfRunConfig
from fp8eval.registry import register_wing
from fp8eval.wing import hydra_wing


def register() -> None:
    """ConfigStore: the shared groups and `perf_schema` (conf/perf.yaml)."""
    register_wing("perf_schema", PerfRunConfig)


register()


def run_wing(typed: PerfRunConfig, run_dir: Path) -> int:
    """Run the sweep, print the table and the run directory; exit 2 on an fp8eval error (one line) or when no arm
    measured anything."""
    from fp8eval.perf.run import run
    from fp8eval.perf.table import format_table

    result = run(typed, run_dir, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    print()
    print(format_table(result))
    print(display_path(run_dir))
    measured = [a for a in result["arms"].values() if any(p.get("n") for p in a.get("points") or [])]
    return 0 if measured else 2  # every arm failed to start, or every request failed: say so in the exit status


main = hydra_wing("fp8eval.perf", "perf", run_wing)


if __name__ == "__main__":
    main()
