"""Hydra callbacks of the `python -m fp8eval` app (registered under `hydra.callbacks` in conf/config.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from fp8eval.core.secrets import redact_files


class RedactHydraFiles(Callback):
    """Hydra saves `.hydra/config.yaml`, `hydra.yaml` and `overrides.yaml` just before the job starts;
    rewrite them with URL credentials redacted (`http://user:pass@host` -> `http://***@host`)."""

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        hydra = config.hydra
        if hydra.output_subdir is not None:
            redact_files(Path(hydra.runtime.output_dir) / str(hydra.output_subdir))
