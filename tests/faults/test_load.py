"""The load test of benchmarks/load_faults.py at a CI size: faults, two SIGKILLs, resume, exactly once."""

from __future__ import annotations

import sys

import pytest
from conftest import REPO


@pytest.mark.slow
def test_load_with_faults_killed_twice_equals_uninterrupted(tmp_path, capsys):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import load_faults

    rc = load_faults.main(["--samples", "400", "--fault-rate", "0.03", "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
