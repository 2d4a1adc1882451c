"""`python -m fp8eval`: evaluate a kv arm against its baseline and print the recovery table.

The last line printed on stdout is the run directory (other tools read it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from fp8eval.config import register_configs
from fp8eval.overrides import check_overrides

register_configs()


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from fp8eval.engines.base import EngineError
    from fp8eval.runner import Runner, RunError, format_table

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    typed = OmegaConf.to_object(cfg)
    try:
        summary = Runner(typed, run_dir).run()
    except (EngineError, RunError) as e:
        print(f"\nfp8eval: {e}", file=sys.stderr)
        sys.exit(2)
    print()
    print(format_table(summary))
    if typed.report and summary.get("recovery") is not None:
        _write_report(run_dir)
    print(run_dir)


def _write_report(run_dir: Path) -> None:
    try:
        from fp8eval.report import write_report
    except ImportError:
        return
    try:
        out = write_report([run_dir], run_dir / "report")
        print(f"report: {out}")
    except Exception as e:  # the run's results stand even when a figure fails
        print(f"report: not written ({type(e).__name__}: {e})", file=sys.stderr)


if __name__ == "__main__":
    check_overrides(sys.argv[1:])
    main()
