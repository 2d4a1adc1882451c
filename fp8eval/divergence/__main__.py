"""`python -m fp8eval.divergence`: divergence of a kv arm's next-token distributions from its baseline's, per
position bucket, on the decode path, the prefill path or both (divergence.path). Writes divergence.json (+
divergence.png) and prints the run dir last."""

from __future__ import annotations

import sys
from pathlib import Path

from fp8eval.core.errors import Fp8evalError
from fp8eval.divergence.config import DivergenceRunConfig
from fp8eval.registry import register_wing
from fp8eval.wing import hydra_wing


def register() -> None:
    """ConfigStore: the shared groups and `divergence_schema` (conf/divergence.yaml)."""
    register_wing("divergence_schema", DivergenceRunConfig)


register()


def run_wing(cfg: DivergenceRunConfig, run_dir: Path) -> None:
    """Run it, print the table and the run directory (an fp8eval error or a ValueError: one line, exit 2)."""
    from fp8eval.divergence.run import format_table, run

    result = run(cfg, run_dir, out=lambda s: print(s, file=sys.stderr))
    print(format_table(result))
    print(run_dir)


main = hydra_wing("fp8eval.divergence", "divergence", run_wing, errors=(Fp8evalError, ValueError))


if __name__ == "__main__":
    main()
