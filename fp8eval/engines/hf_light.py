"""transformers imported without scikit-learn and SciPy (part of issue 26's two-minute default run).

transformers 5 imports `sklearn.metrics.roc_curve` at the top of generation/candidate_generator.py and
`scipy.optimize.linear_sum_assignment` at the top of its object-detection losses (reached through
loss/loss_utils.py from modeling_utils) whenever those packages are installed (they are here: lm-eval needs them):
~1-1.5 s of a 2-core machine's start, for assisted generation's candidate strategy and detection models' matchers,
which fp8eval never runs (the reference engine has its own decode loop and runs causal LMs). `import_transformers()`
imports those modules once with transformers told the two packages are absent; both stay importable for everything
else (lm-eval's metrics import them themselves).
"""

from __future__ import annotations

import sys

# module -> the availability check it reads at import time
_MODULES = {"transformers.generation.candidate_generator": "is_sklearn_available",
            "transformers.loss.loss_utils": "is_scipy_available"}


def import_transformers() -> None:
    """Import those transformers modules without scikit-learn / SciPy; each is left alone when it (or the package it
    would pull in) is already imported, and nothing happens when transformers is missing (the import that follows says
    so)."""
    for module, check in _MODULES.items():
        package = "sklearn" if "sklearn" in check else "scipy"
        if module in sys.modules or package in sys.modules:
            continue
        try:
            import transformers.utils as tu
        except ImportError:
            return
        real = getattr(tu, check, None)
        if real is None:
            continue
        setattr(tu, check, lambda: False)
        try:
            __import__(module)
        except Exception:  # noqa: BLE001 - the engine's own import of transformers reports the real problem
            pass
        finally:
            setattr(tu, check, real)
