"""The reference engine's start imports transformers without scikit-learn and SciPy (fp8eval.engines.hf_light), which
stay importable, and transformers' own availability checks answer as before afterwards."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

_PROBE = """
import sys
from fp8eval.engines.hf_light import import_transformers
import transformers.utils as tu
before = (tu.is_sklearn_available(), tu.is_scipy_available())
import_transformers()
from transformers import AutoTokenizer, AutoModelForCausalLM  # what the reference engine imports next
import transformers.generation.candidate_generator, transformers.loss.loss_utils
print('sklearn' in sys.modules, 'scipy' in sys.modules, before == (tu.is_sklearn_available(), tu.is_scipy_available()))
if before[0]:
    import sklearn.metrics  # still importable
if before[1]:
    import scipy.optimize
print(before)
"""


def test_transformers_start_without_sklearn_and_scipy():
    pytest.importorskip("transformers")
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, second = proc.stdout.strip().splitlines()[-2:]
    assert first == "False False True"
    if second != "(True, True)":
        pytest.skip(f"scikit-learn / SciPy not both installed here ({second}): nothing to keep out")
