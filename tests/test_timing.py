"""summary.json's "timing": engine time (start-up, waiting for completions, close) against the harness's."""

from __future__ import annotations

import time

from conftest import run_inprocess

from fp8eval.core.timing import EngineClock


def _slow(n: int, each: float):
    for i in range(n):
        time.sleep(each)
        yield i


def test_waits_for_the_engine_are_engine_time_the_rest_is_harness():
    clock = EngineClock()
    with clock.engine("start"):
        time.sleep(0.05)
    for _ in clock.stream(_slow(3, 0.05), "generate"):
        with clock.harness("write_records"):
            time.sleep(0.02)
    t = clock.report()
    assert t["engine_parts"]["start"] >= 0.05 and t["engine_parts"]["generate"] >= 0.15
    # The three 20 ms writes are the harness's, the engine's sleeps are not (sleeps overrun on a busy machine).
    assert t["harness_parts"]["write_records"] >= 0.06
    assert t["harness_parts"]["write_records"] - 1e-3 <= t["harness_s"] < t["engine_s"], t
    assert abs(t["engine_s"] + t["harness_s"] - t["wall_s"]) < 1e-3
    assert abs(t["harness_share"] - t["harness_s"] / t["engine_s"]) < 1e-3


def test_a_run_reports_engine_and_harness_time(tmp_path):
    s = run_inprocess(tmp_path, ["engine=fake", "task.lengths=[1024]", "task.depths=[0,100]"])
    t = s["timing"]
    assert set(t) >= {"wall_s", "engine_s", "harness_s", "harness_share", "engine_parts", "harness_parts"}
    assert {"start", "describe", "generate", "close"} <= set(t["engine_parts"])
    assert {"plan", "write_records"} <= set(t["harness_parts"])
    assert abs(t["engine_s"] + t["harness_s"] - t["wall_s"]) < 1e-3
    assert s["wall_s"] is not None  # the old field stays


def test_harness_work_during_a_background_engine_call_is_reported_as_overlapped():
    clock = EngineClock()
    closing = clock.background("close", time.sleep, 0.3)
    with clock.harness("summary"):
        time.sleep(0.1)
    closing.join()
    t = clock.report()
    assert t["engine_parts"]["close"] >= 0.3
    assert 0.08 <= t["harness_overlapped_s"] <= t["harness_parts"]["summary"] + 1e-3
    assert t["harness_s"] < 0.05, t  # wall minus engine: the summary ran inside the close
    assert abs(t["harness_work_s"] - (t["harness_s"] + t["harness_overlapped_s"])) < 1e-3
    assert abs(t["engine_s"] + t["harness_s"] - t["wall_s"]) < 1e-3


def test_a_background_engine_call_reraises_its_error():
    clock = EngineClock()

    def fail():
        raise RuntimeError("close failed")

    closing = clock.background("close", fail)
    try:
        closing.join()
    except RuntimeError as e:
        assert "close failed" in str(e)
    else:
        raise AssertionError("the error was swallowed")
    assert "close" in clock.report()["engine_parts"]


def test_the_last_arm_closes_while_the_summary_is_computed(tmp_path, monkeypatch):
    from fp8eval.engines.fake import FakeEngine

    closed = []

    def slow_close(self):
        time.sleep(0.5)
        closed.append(self.kv.name)

    monkeypatch.setattr(FakeEngine, "close", slow_close, raising=False)
    s = run_inprocess(tmp_path, ["engine=fake", "task.lengths=[1024]", "task.depths=[0,100]"])
    t = s["timing"]
    assert closed == ["fp8", "bf16"]  # the variant first, the baseline last: both closed before run() returns
    assert t["engine_parts"]["close"] >= 1.0
    assert t["harness_overlapped_s"] > 0 and t["harness_overlapped_s"] <= t["harness_parts"]["summary"] + 1e-3
    assert abs(t["harness_work_s"] - t["harness_s"] - t["harness_overlapped_s"]) < 1e-3
