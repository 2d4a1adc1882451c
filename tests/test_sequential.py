"""stop=sequential: the betting e-processes, the rounds, and the simulation benchmark (docs/statistics.md)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fp8eval.metrics import sequential
from fp8eval.metrics.sequential import Design, decide, log_capital, n_max_for
from fp8eval.stopping import Rounds, StopError, check

ROOT = Path(__file__).resolve().parents[1]


def test_e_processes_never_let_a_factor_reach_zero():
    d = Design()
    x = np.array([-0.95] * 50 + [1.0] * 50)
    lp, lm = log_capital(x, 0.95, d)
    assert np.isfinite(lp).all() and np.isfinite(lm).all()
    assert np.diff(lp).min() >= math.log(1 - d.cap) - 1e-12


def test_type_one_error_at_the_gate_stays_below_alpha_cs():
    """Ville: under a truth exactly at the gate neither e-process should cross 2/alpha_cs more often than
    alpha_cs (checked after every sample, 3,000 samples, 2,000 runs)."""
    rng = np.random.default_rng(1)
    d = Design(alpha_cs=0.05)
    g = 0.95
    b = rng.random((2000, 3000)) < 0.8
    # recovery exactly 95 %: lose 5 % of right answers, gain none
    v = b & (rng.random(b.shape) >= 0.05)
    lp, lm = log_capital(v.astype(float) - g * b, g, d)
    thr = math.log(2 / d.alpha_cs)
    crossed = ((lp >= thr).any(axis=1) | (lm >= thr).any(axis=1)).mean()
    assert crossed <= d.alpha_cs


def test_clear_cases_stop_early_and_deterministically():
    d = Design()
    keep = [[(1.0, 1.0)]] * 300 + [[(0.0, 0.0)]] * 60
    order = np.random.default_rng(0).permutation(len(keep))
    seq = [keep[i] for i in order]
    res = decide(seq, d, n_max=2000)
    assert res.decision == "pass" and res.n_used < 360 and res.how == "confidence sequence"
    assert decide(seq, d, n_max=2000) == res  # the same records, the same decision
    drop = [[(1.0, float(i % 4 != 0))] for i in range(400)]  # a quarter lost
    assert decide(drop, d, n_max=2000).decision == "fail"


def test_the_last_look_uses_the_fixed_n_interval():
    d = Design()
    few = [[(1.0, 1.0)]] * 9  # nine pairs without a flip: not enough for anything
    assert decide(few, d, n_max=20).decision == "continue"
    res = decide(few, d, n_max=9)
    assert (res.decision, res.how) == ("inconclusive", "final look (n_max)")


def test_n_max_over_n_fixed():
    assert n_max_for(1000, Design()) == 1069  # ((z.98 + z.8) / (z.975 + z.8))^2 = 1.0683


def test_cs_bounds_cover_the_point_and_shrink():
    d = Design()
    rng = np.random.default_rng(2)
    small = [[(1.0, float(rng.random() > 0.02))] for _ in range(100)]
    big = small + [[(1.0, float(rng.random() > 0.02))] for _ in range(900)]
    lo1, hi1 = sequential.cs_bounds(small, d)
    lo2, hi2 = sequential.cs_bounds(big, d)
    point = 100 * sum(v for s in big for _, v in s) / len(big)
    assert lo2 <= point <= hi2 and lo1 <= lo2 and hi2 <= hi1


def test_design_refuses_nonsense():
    with pytest.raises(ValueError, match="alpha_cs"):
        Design(alpha_cs=0.1, alpha=0.05).check()


# --- rounds ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Sample:
    id: str
    groups: tuple


def _items(n_per_bucket=40):
    return [SimpleNamespace(sample=_Sample(f"s{b}-{i}", (f"ctx={b}",)), repeat=0)
            for b in (1024, 2048) for i in range(n_per_bucket)]


def _records(items, lose):
    base, var = [], []
    for it in items:
        key = {"sample_id": it.sample.id, "repeat": 0, "status": "ok"}
        base.append({**key, "score": 1.0})
        var.append({**key, "score": 0.0 if lose(it.sample.id) else 1.0})
    return base, var


def test_rounds_take_more_samples_only_where_undecided():
    stop = SimpleNamespace(name="sequential", round_size=8, alpha_cs=0.01, cap=0.8, by="auto")
    stats = SimpleNamespace(gate=95.0, alpha=0.05, right_at=0.5)
    items = _items(200)
    r = Rounds(items, stop, stats, seed=1)
    assert r.family == "ctx" and set(r.order) == {"ctx=1024", "ctx=2048"}
    assert len(r.items()) == 16
    lose = lambda sid: sid.startswith("s2048") and int(sid.split("-")[1]) % 2 == 0  # noqa: E731
    while True:
        base, var = _records(r.items(), lose)
        if not r.advance(base, var):
            break
    out = r.summary(*_records(r.items(), lose))
    assert out["buckets"]["ctx=2048"]["decision"] == "fail"
    assert out["buckets"]["ctx=2048"]["samples_sent"] < 200
    assert out["buckets"]["ctx=1024"]["decision"] == "pass"
    assert out["decision"] == "fail" and out["samples_sent"] < out["samples_planned"]
    # a rerun from the same records replays the same rounds
    r2 = Rounds(items, stop, stats, seed=1)
    while r2.advance(*_records(r2.items(), lose)):
        pass
    assert r2.taken == r.taken and r2.results == r.results


def test_check_refuses_what_cannot_run():
    stop = SimpleNamespace(name="sequential", round_size=8)
    with pytest.raises(StopError, match="baseline"):
        check(stop, baseline_present=False, shard=None)
    with pytest.raises(StopError, match="shards"):
        check(stop, baseline_present=True, shard="0/2")
    with pytest.raises(StopError, match="one of"):
        check(SimpleNamespace(name="sometimes"), True, None)


# --- the benchmark, tiny ----------------------------------------------------------------------------------
def test_sequential_benchmark_smoke():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "benchmarks/sequential.py", "--runs", "50", "--delta", "5",
                           "--p-baseline", "0.6", "--gain", "0.1"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert lines[0]["n_max"] >= lines[0]["n_fixed"] and lines[-1]["summary"]
    assert len(lines) == 8 and all("sequential" in x for x in lines[1:-1])


# --- the runner -------------------------------------------------------------------------------------------
SEQ = ["engine=fake", "stop=sequential", "stop.round_size=20", "task.lengths=[1024,2048]", "task.needles_per_cell=60"]


@pytest.mark.parametrize("error, decision", [(0.0, "pass"), (0.3, "fail")])
def test_sequential_run_stops_early_and_resumes_without_requests(tmp_path, error, decision):
    from conftest import run_inprocess

    over = SEQ + [f"+engine.engine_args.fake_fp8_error={error}"]
    first = run_inprocess(tmp_path, over, "a")
    seq = first["sequential"]
    assert seq["decision"] == decision and seq["samples_sent"] < seq["samples_planned"] == 360
    assert first["arms"]["fp8"]["n_samples"] == seq["samples_sent"]
    assert first["arms"]["fp8"]["requests_sent"] == seq["samples_sent"]  # summed over the rounds
    again = run_inprocess(tmp_path, over, "b")
    assert [a["requests_sent"] for a in again["arms"].values()] == [0, 0]
    assert again["sequential"] == seq


def test_sequential_needs_a_baseline(tmp_path):
    from conftest import run_inprocess

    with pytest.raises(StopError, match="baseline"):
        run_inprocess(tmp_path, SEQ + ["baseline=none"])
