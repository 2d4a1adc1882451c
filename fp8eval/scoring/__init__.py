"""Pure scoring functions, one module per family. Names resolve lazily so importing one scorer never
imports another's dependencies (math-verify, difflib, the sandbox)."""

from __future__ import annotations

import importlib

_EXPORTS = {
    "mrcr_grade": "fp8eval.scoring.mrcr",
    "last_boxed": "fp8eval.scoring.math",
    "boxed_answers": "fp8eval.scoring.math",
    "aime_integer": "fp8eval.scoring.math",
    "math_verify_equal": "fp8eval.scoring.math",
    "score_aime": "fp8eval.scoring.math",
    "score_math": "fp8eval.scoring.math",
    "extract_letter": "fp8eval.scoring.mcq",
    "choice_order": "fp8eval.scoring.mcq",
    "correct_letter": "fp8eval.scoring.mcq",
    "score_mcq": "fp8eval.scoring.mcq",
    "extract_code": "fp8eval.scoring.code",
    "decode_tests": "fp8eval.scoring.code",
    "score_code": "fp8eval.scoring.code",
    "niah_score": "fp8eval.scoring.niah",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fp8eval.scoring' has no attribute {name!r}")


def __dir__():
    return sorted(_EXPORTS)
