"""Hydra callbacks of fp8eval's Hydra apps (registered under `hydra.callbacks` in the YAML of every wing that
`fp8eval.wing.hydra_wing` runs: conf/config.yaml, divergence, sensitivity, pareto, power, perf and calibrate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from fp8eval.core.secrets import guard_std_streams, redact_file, redact_files, redact_tree


def _select(config: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    try:
        return OmegaConf.select(config, key, default=None)
    except Exception:  # noqa: BLE001 - an unresolvable interpolation: nothing to redact there
        return None


class RedactHydraFiles(Callback):
    """Everything Hydra writes goes through `fp8eval.core.secrets.redact`:

    - before each job: its `.hydra/config.yaml`, `hydra.yaml` and `overrides.yaml` (where Hydra writes
      overrides with `:` escaped as `\\:`) and, in a `-m` sweep, the sweep's `multirun.yaml`;
    - after each job: every text file of its run directory (summary.json, reports, logs);
    - after a sweep: `multirun.yaml` once more;
    and stdout, stderr and logging are redacted from the first callback on (`guard_std_streams`)."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        """Redact the streams before the job prints anything."""
        guard_std_streams()

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        """Redact the streams before the sweep prints anything."""
        guard_std_streams()

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        """Redact the files Hydra saved for this job (and the sweep's multirun.yaml)."""
        guard_std_streams()
        hydra = config.hydra
        subdir = _select(config, "hydra.output_subdir")
        out = _select(config, "hydra.runtime.output_dir")
        if subdir is not None and out:
            redact_files(Path(out) / str(subdir))
        self._multirun_yaml(hydra, out)

    def on_job_end(self, config: Any, job_return: Any = None, **kwargs: Any) -> None:
        """Redact every text file the job left in its run directory."""
        out = _select(config, "hydra.runtime.output_dir")
        if out:
            redact_tree(Path(out))
        self._multirun_yaml(config.hydra, out)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        """Redact multirun.yaml once the sweep is over."""
        self._multirun_yaml(config.hydra)

    @staticmethod
    def _multirun_yaml(hydra: Any, output_dir: Any = None) -> None:
        mode = _select(hydra, "mode")
        if mode is None or not str(mode).endswith("MULTIRUN"):
            return
        places = [_select(hydra, "sweep.dir")] + ([Path(str(output_dir)).parent] if output_dir else [])
        for place in {str(p) for p in places if p}:
            path = Path(place) / "multirun.yaml"
            if path.is_file():
                redact_file(path)
