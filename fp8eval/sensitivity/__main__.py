"""`python -m fp8eval.sensitivity model=... kv=fp8 [sensitivity.lengths=[1024,4096] ...]`.

Prints the cost before any pass, a progress bar on stderr, and the run dir as the last stdout line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from fp8eval.core.paths import display_path
from fp8eval.core.secrets import guard_std_streams
from fp8eval.registry import register_wing
from fp8eval.sensitivity.config import SensitivityRunConfig, unknown_key_message
from fp8eval.validate import validate_config


def register() -> None:
    """ConfigStore: the shared groups and `sensitivity_schema` (conf/sensitivity.yaml)."""
    register_wing("sensitivity_schema", SensitivityRunConfig)


register()


@hydra.main(config_path="../../conf", config_name="sensitivity", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """`python -m fp8eval.sensitivity`: rank the layers, write the run dir's outputs, print sensitivity.md (up to the
    heatmap) and the run directory; exit 2 on an fp8eval error."""
    from fp8eval.core.errors import Fp8evalError
    from fp8eval.sensitivity import outputs
    from fp8eval.sensitivity.run import run

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    typed = OmegaConf.to_object(cfg)
    try:
        validate_config(typed)  # every wing's one check, before any engine starts
        result = run(typed)
    except Fp8evalError as e:
        print(f"\nfp8eval.sensitivity: {e}", file=sys.stderr)
        sys.exit(2)
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


if __name__ == "__main__":
    guard_std_streams()  # every line printed, Hydra's errors included, is redacted (fp8eval.core.secrets)
    _check(sys.argv[1:])
    main()
