"""Run directories that never collide: `${fp8eval_unique_dir:PATH}` in `hydra.run.dir`.

Two runs started in the same second compose the same timestamped PATH; the resolver creates the
directory itself (mkdir without exist_ok is atomic, on NFS too) and, when PATH exists, takes PATH-2,
PATH-3, ... instead. The result is memoised for the process, because Hydra resolves `hydra.run.dir` more
than once. The last stdout line of a run is still the directory that was used.
"""

from __future__ import annotations

import os
from pathlib import Path

_CHOSEN: dict[str, str] = {}


def unique_dir(path: str) -> str:
    """The first of PATH, PATH-2, PATH-3, ... that this call could create."""
    if path in _CHOSEN:
        return _CHOSEN[path]
    if ".." in Path(path).parts:  # a name (model.name=../../X) would put the run outside the runs root
        raise ValueError(f"run directory {path!r} would leave its root: a name in it contains '/' or '..'")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        candidate = path if n == 1 else f"{path}-{n}"
        try:
            os.mkdir(candidate)
            break
        except FileExistsError:
            n += 1
    _CHOSEN[path] = candidate
    return candidate


def register_resolver() -> None:
    """Register `fp8eval_unique_dir` (idempotent)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("fp8eval_unique_dir"):
        OmegaConf.register_new_resolver("fp8eval_unique_dir", unique_dir)
