"""Replica pools (fp8eval.engines.pool) against fake OpenAI-compatible servers on loopback."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from fp8eval.arms import arm_spec
from fp8eval.engines.base import EngineError
from fp8eval.engines.pool import PoolEngine, build_server_engine, odd_replicas
from fp8eval.engines.server import ServerEngine

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai_server import FakeOpenAIServer
from test_server_engine import BF16, FP8, make_cfg, requests

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what the default model config asks a server for


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(ServerEngine, "retry_backoff_s", 0.01)
    monkeypatch.setattr(ServerEngine, "retry_backoff_cap_s", 0.05)


def pool_cfg(urls, kv_name="bf16", **engine):
    cfg = make_cfg(None, **engine)
    cfg.engine.base_urls = {kv_name: list(urls)}
    return cfg


def test_one_url_in_a_list_is_a_plain_server_with_the_same_fingerprint():
    with FakeOpenAIServer() as srv:
        single = build_server_engine(make_cfg(srv.url), arm_spec(make_cfg(srv.url), BF16))
        listed = build_server_engine(pool_cfg([srv.url]), arm_spec(pool_cfg([srv.url]), BF16))
        assert type(single) is type(listed) is ServerEngine
        assert single.describe() == listed.describe()
        single.close()
        listed.close()


def test_pool_of_three_spreads_load_and_describes_like_one_server():
    servers = [FakeOpenAIServer().start() for _ in range(3)]
    try:
        for s in servers:
            s.slow_next, s.slow_s = 1000, 0.02
        pool = build_server_engine(pool_cfg([s.url for s in servers], concurrency=2), arm_spec(pool_cfg([s.url for s in servers], concurrency=2), BF16))
        one = ServerEngine(make_cfg(servers[0].url), arm_spec(make_cfg(servers[0].url), BF16))
        assert isinstance(pool, PoolEngine) and pool.describe() == one.describe()
        one.close()
        reqs = requests(18, n=2)
        got = {c.request_id: c for c in pool.generate(reqs)}
        assert sorted(got) == sorted(r.id for r in reqs)
        assert all(len(c.choices) == 2 and c.choices[0].finish_reason == "stop" for c in got.values())
        assert all(s.generation_calls >= 3 for s in servers), [s.generation_calls for s in servers]
        assert sum(s.generation_calls for s in servers) == 18
        pool.close()
    finally:
        for s in servers:
            s.stop()


def test_replica_that_differs_is_refused_by_name():
    a, b, c = (FakeOpenAIServer(), FakeOpenAIServer(), FakeOpenAIServer(version="0.31.0"))
    with a, b, c, pytest.raises(EngineError) as err:
        build_server_engine(pool_cfg([a.url, b.url, c.url]), arm_spec(pool_cfg([a.url, b.url, c.url]), BF16))
    msg = str(err.value)
    assert f"replica 2 ({c.url})" in msg and "server_version" in msg and "0.31.0" in msg
    assert "replica 0" not in msg and "replica 1" not in msg
    assert a.generation_calls == b.generation_calls == c.generation_calls == 0


def test_replica_failing_its_own_preflight_is_named():
    a, b = FakeOpenAIServer(cache_dtype="fp8"), FakeOpenAIServer(cache_dtype="auto")
    with a, b, pytest.raises(EngineError, match=rf"Replica 1 \({b.url}\) of arm fp8 failed its preflight"):
        build_server_engine(pool_cfg([a.url, b.url], kv_name="fp8"), arm_spec(pool_cfg([a.url, b.url], kv_name="fp8"), FP8))


def test_odd_replicas_majority_and_tie():
    assert odd_replicas([{"v": 1}, {"v": 1}, {"v": 2}]) == [(2, ["v: 2 vs 1"])]
    assert [i for i, _ in odd_replicas([{"v": 1}, {"v": 2}])] == [0, 1]
    assert odd_replicas([{"v": 1}, {"v": 1}]) == []


def test_all_replicas_down_stops_with_a_clear_error():
    a, b = FakeOpenAIServer().start(), FakeOpenAIServer().start()
    pool = build_server_engine(pool_cfg([a.url, b.url], max_retries=1), arm_spec(pool_cfg([a.url, b.url], max_retries=1), BF16))
    a.stop()
    b.stop()
    with pytest.raises(EngineError, match="Every replica of arm bf16 is down"):
        list(pool.generate(requests(4)))
    pool.close()


def test_replica_killed_mid_run_every_sample_repeat_exactly_once(tmp_path):
    """Through the runner and its records store: one of three replicas dies mid-run; its in-flight
    requests go elsewhere and every (sample, repeat) is recorded exactly once, in one invocation."""
    from conftest import run_inprocess

    from fp8eval.records import read_records

    servers = [FakeOpenAIServer(model=MODEL).start() for _ in range(3)]
    for s in servers:
        s.slow_next, s.slow_s = 1000, 0.4
    urls = ",".join(s.url for s in servers)
    args = ["engine=server", f"engine.base_urls.bf16=[{urls}]", "engine.concurrency=2", "engine.max_retries=2",
            "engine.request_timeout_s=5", "kv=bf16", "baseline=none", "task=aime25", "task.limit=15",
            "task.repeats=2", "model.max_model_len=4096", "sampling.max_tokens=64",
            "sampling.temperature=0.6"]
    victim = servers[1]

    def kill_when_it_has_answered():
        deadline = time.time() + 30
        while time.time() < deadline and len(victim.completed) < 1:
            time.sleep(0.01)
        victim.stop()

    killer = threading.Thread(target=kill_when_it_has_answered)
    killer.start()
    try:
        s = run_inprocess(tmp_path, args)
    finally:
        killer.join()
        for srv in servers:
            srv.stop()
    [path] = list((tmp_path / "records" / "aime25").glob("*.jsonl"))
    keys = [(r["sample_id"], r["repeat"]) for r in read_records(path)]
    assert len(keys) == len(set(keys)) == 30
    arm = s["arms"]["bf16"]
    assert arm["requests_sent"] == 15 and arm["n_errors"] == 0
    dropped = arm["engine_warnings"].get("replica_dropped", [])
    assert len(dropped) == 1 and dropped[0].startswith(f"replica 1 ({victim.url}) dropped"), arm["engine_warnings"]


def test_every_kv_option_has_a_base_urls_slot():
    """`engine.base_urls.<kv>=[...]` (the documented command, no `+`) works for every kv option."""
    from conftest import REPO, compose

    kv_names = sorted(p.stem for p in (REPO / "conf" / "kv").glob("*.yaml"))
    cfg = compose(["engine=server", "engine.base_urls.fp8=[http://a:1,http://b:2]"])
    assert sorted(cfg.engine.base_urls) == kv_names
    from fp8eval.engines.pool import arm_urls

    assert arm_urls(cfg, cfg.kv) == ["http://a:1", "http://b:2"]
    cfg.engine.base_url = "http://c:3"
    assert arm_urls(cfg, compose(["kv=bf16"]).kv) == ["http://c:3"]
