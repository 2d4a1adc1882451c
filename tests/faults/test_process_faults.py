"""Processes: scoring workers die with the runner; SIGINT is one line; stale conversions are removed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO

WORKERS = r"""
import os, sys, time
from fp8eval.scoring.pool import Scorer

class T:
    def quick_score(self, s, a, repeat=0):
        return None
    def score(self, s, a, repeat=0):
        return os.getpid()

sc = Scorer(T(), workers=2)
sc.submit("k", [(None, "x", 0)])
list(sc.drain())
print(" ".join(str(p) for p in sc._pool._processes), flush=True)
time.sleep(60)
"""


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # a zombie that nobody reaps is gone too (its parent died; init reaps it)
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_scoring_workers_die_when_the_runner_is_killed():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", WORKERS], env=env, stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    proc.kill()  # SIGKILL: no handler, no atexit
    proc.wait()
    assert all(_gone(pid, 5.0) for pid in pids), pids


def test_sigint_ends_with_one_line_and_keeps_records(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "fp8eval", "engine=fake", "task.lengths=[1024,2048]",
                             "task.depths=[0,25,50,75,100]", "+engine.engine_args.fake_delay_s=0.3",
                             f"records_dir={tmp_path / 'records'}", "progress=false", "report=false"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # Ctrl-C as a terminal delivers it: a run started in the background of a shell without
                            # job control inherits SIGINT ignored, and Python then keeps it ignored (as it should)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
            p.stat().st_size for p in (tmp_path / "records").glob("niah/*.jsonl")):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("fp8eval: interrupted; finished records are kept, rerun the same "
                                            "command to resume")


def test_stale_conversion_temp_dirs_are_removed(tmp_path):
    from fp8eval.models import remove_stale_temps

    target = tmp_path / "models" / "m-abc"
    dead = target.with_name(target.name + ".tmp999999999")
    live = target.with_name(target.name + f".tmp{os.getppid()}")
    for d in (dead, live):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "model.safetensors").write_bytes(b"x" * 1000)
    torn = target.with_name(target.name + ".tmp999999998")  # a killed GGUF assembly: a file
    torn.write_bytes(b"GGUF" + b"\0" * 100)
    assert sorted(remove_stale_temps(target)) == sorted([dead, torn])
    assert not dead.exists() and not torn.exists() and live.exists()
