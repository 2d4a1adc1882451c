"""`python -m fp8eval.power` from priors and from pilot records, and the verdict block of a real run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, run_cli, summary_of


def _power(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "fp8eval.power", f"hydra.run.dir={tmp_path / 'power'}", *overrides],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_power_from_priors_matches_the_issue(tmp_path):
    proc = _power(tmp_path, "model=qwen3-30b-thinking", "task=aime25", "power.delta=3")
    assert proc.returncode == 0, proc.stderr
    # issue 36: the prior has a between-question variance (omega2 0.01), so no number of repeats on AIME25's
    # 30 problems reaches 3 points (the issue's 7.23 / 175 / 59 assumed omega2 = 0)
    assert "30 samples x 10 repeats" in proc.stdout and "MDE 8.86 points" in proc.stdout
    assert "no number of repeats on the planned samples reaches it" in proc.stdout
    assert "more questions beat more repeats" in proc.stdout and "task=aime pools" in proc.stdout
    out = json.loads((tmp_path / "power" / "power.json").read_text())
    t = out["tasks"][0]
    assert t["variance"]["source"].startswith("prior") and t["samples_needed"] == 262
    assert t["repeats_needed"] is None and t["samples_needed_range"] == [197, 371]
    assert t["cost"]["requests_per_arm"] == 262  # one request per sample: its 10 repeats share it


def test_power_of_a_suite_and_a_recovery_floor(tmp_path):
    proc = _power(tmp_path, "model=qwen3-30b-thinking", "suite=reasoning", "power.recovery_floor=97")
    assert proc.returncode == 0, proc.stderr
    tasks = json.loads((tmp_path / "power" / "power.json").read_text())["tasks"]
    assert [t["task"] for t in tasks] == ["aime25", "gpqa_diamond", "math500", "livecodebench"]
    mde = {t["task"]: round(t["mde_pts"], 1) for t in tasks}
    assert mde == {"aime25": 8.9, "gpqa_diamond": 4.8, "math500": 2.0, "livecodebench": 3.7}


def test_power_refuses_two_targets(tmp_path):
    proc = _power(tmp_path, "power.delta=3", "power.recovery_floor=95")
    assert proc.returncode == 2 and "exactly one target" in proc.stderr


@pytest.mark.parametrize("error", [0.0, 0.5])
def test_power_from_a_pilot_run(tmp_path, error):
    """A fake-engine pilot (4 needles per cell, so cells are clusters of 4): the variance comes from it."""
    proc = run_cli(tmp_path, ["engine=fake", "report=false", "task.needles_per_cell=4",
                              f"+engine.engine_args.fake_fp8_error={error}", f"hydra.run.dir={tmp_path / 'pilot'}"])
    s = summary_of(proc)
    v = s["verdict"]["overall"]
    assert v["n_clusters"] == 9 and v["n_pairs"] == 36 and v["ci_method"] == "fieller-clustered"
    assert v["verdict"] == ("inconclusive" if error == 0 else "fail")
    assert "MDE" in proc.stdout and "verdict (gate 95%)" in proc.stdout
    p = _power(tmp_path, "task.needles_per_cell=4", "power.delta=10", f"power.pilot=[{tmp_path / 'pilot'}]")
    assert p.returncode == 0, p.stderr
    t = json.loads((tmp_path / "power" / "power.json").read_text())["tasks"][0]
    assert t["variance"]["source"].startswith("pilot: 36 paired records")
    assert (t["variance"]["omega2"] + t["variance"]["sigma2_w"] > 0) == (error > 0)
    assert t["samples"] == 36 and t["samples_needed"] > 0


def test_default_shaped_run_does_not_say_keep(tmp_path):
    """`python -m fp8eval`'s grid (9 samples) with no flip: the report says undecided, never keep."""
    proc = run_cli(tmp_path, ["engine=fake", f"hydra.run.dir={tmp_path / 'run'}"])
    s = summary_of(proc)
    assert s["verdict"]["overall"]["verdict"] == "inconclusive" and s["verdict"]["overall"]["lost"] == 0
    assert s["verdict"]["overall"]["more_samples"] > 0
    verdicts = json.loads((tmp_path / "run" / "report" / "verdicts.json").read_text())
    assert [d["decision"] for d in verdicts["decisions"]] == ["undecided"]
    assert "inconclusive" in proc.stdout and "keep" not in proc.stdout.split("report:")[0]
