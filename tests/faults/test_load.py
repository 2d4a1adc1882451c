"""The load test of benchmarks/load_faults.py at a CI size: faults, two SIGKILLs, a repair in the middle (a run
started while it works), resume, exactly once, group commit."""

from __future__ import annotations

import json
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
    result = json.loads(out.strip().splitlines()[-1])
    middle = result["repair_in_the_middle"]
    assert middle["repair_rc"] in (0, 1) and middle["repair_out"], middle  # repaired, or refused a live writer
    commit = result["fsync"]["group_commit"]
    assert commit["appends"] == 800 and 0 < commit["fsyncs"] < commit["appends"], commit
