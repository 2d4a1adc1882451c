"""`python -m fp8eval.sensitivity model=... kv=fp8 [sensitivity.lengths=[1024,4096] ...]`.

Prints the cost before any pass, a progress bar on stderr, and the run dir as the last stdout line.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fp8eval.core.paths import display_path
from fp8eval.registry import register_wing
from fp8eval.sensitivity.config import SensitivityRunConfig, unknown_key_message
from fp8eval.wing import hydra_wing


def register() -> None:
    """ConfigStore: the shared groups and `sensitivity_schema` (conf/sensitivity.yaml)."""
    register_wing("sensitivity_schema", SensitivityRunConfig)


register()


def run_wing(typed: SensitivityRunConfig, run_dir: Path) -> None:
    """Rank the layers, write the run dir's outputs, print sensitivity.md (up to the heatmap) and the run directory
    (an fp8eval error: one line, exit 2)."""
    from fp8eval.sensitivity import outputs
    from fp8eval.sensitivity.run import run

    result = run(typed)
    outputs.write(run_dir, result, typed.kv)
    print((run_dir / "sensitivity.md").read_text(encoding="utf-8").split("\n![heatmap]")[0])
    print(display_path(run_dir))


def _check(argv: list[str]) -> None:
    for arg in argv:
        if arg.startswith("-"):
            continue
        key, eq, _ = arg.lstrip("+~").partition("=")
        if eq and "." in key:
            msg = unknown_key_message(key)
            if msg:
                print(f"fp8eval.sensitivity: {msg}", file=sys.stderr)
                sys.exit(2)


main = hydra_wing("fp8eval.sensitivity", "sensitivity", run_wing, argv=_check)


if __name__ == "__main__":
    main()
