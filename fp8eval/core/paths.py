"""Where things are: the project's shipped data and configs, and the one cache root."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# An installed wheel carries conf/ and tasks/ as package data in fp8eval/_data/ (setup.py's build step copies
# them there); a checkout (editable install included) reads them in place.
_SHIPPED = Path(__file__).resolve().parents[1] / "_data"
DATA_ROOT = _SHIPPED if (_SHIPPED / "conf" / "config.yaml").is_file() else PROJECT_ROOT
CONF_DIR = DATA_ROOT / "conf"
TASK_DATA_ROOT = DATA_ROOT / "tasks"


def cache_root() -> Path:
    """Every cache of fp8eval (converted models, calibrations, MRCR manifests, o200k, reports, file
    hashes, vLLM logs outside the CLI): `$FP8EVAL_CACHE`, else `$XDG_CACHE_HOME/fp8eval`, else
    `~/.cache/fp8eval`."""
    if os.environ.get("FP8EVAL_CACHE"):
        return Path(os.environ["FP8EVAL_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fp8eval"


def display_path(path: Path | str) -> str:
    """`path` relative to the working directory when it lies under it (what we print and show in docs),
    else as given: a transcript never carries the machine's absolute paths for run dirs."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)
