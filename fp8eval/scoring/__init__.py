"""Pure scoring functions, one module per family. Names resolve lazily so importing one scorer never
imports another's dependencies (math-verify, difflib, the sandbox)."""

from __future__ import annotations

import importlib

_EXPORTS = {
    "mrcr_grade": "fp8eval.scoring.mrcr",
    "niah_score": "fp8eval.scoring.niah",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fp8eval.scoring' has no attribute {name!r}")


def __dir__():
    return sorted(_EXPORTS)
