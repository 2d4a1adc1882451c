"""`python -m fp8eval.divergence`: prefill-only divergence of a kv arm's next-token distributions from its
baseline's, per position bucket. Writes divergence.json (+ divergence.png) and prints the run dir last."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from fp8eval.core.paths import CONF_DIR
from fp8eval.core.secrets import guard_std_streams
from fp8eval.divergence.config import DivergenceRunConfig
from fp8eval.registry import register_wing


def register() -> None:
    """ConfigStore: the shared groups and `divergence_schema` (conf/divergence.yaml)."""
    register_wing("divergence_schema", DivergenceRunConfig)


register()


@hydra.main(config_path=str(CONF_DIR), config_name="divergence", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """`python -m fp8eval.divergence`: run it, print the table and the run directory; exit 2 on an fp8eval error or
    a ValueError, after printing it."""
    from fp8eval.core.errors import Fp8evalError
    from fp8eval.divergence.run import format_table, run

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        result = run(OmegaConf.to_object(cfg), run_dir, out=lambda s: print(s, file=sys.stderr))
    except (Fp8evalError, ValueError) as e:
        print(f"\nfp8eval.divergence: {e}", file=sys.stderr)
        sys.exit(2)
    print(format_table(result))
    print(run_dir)


if __name__ == "__main__":
    guard_std_streams()  # every line printed, Hydra's errors included, is redacted (fp8eval.core.secrets)
    main()
