"""engine=server against hostile loopback servers: a trickle that never trips a read timeout, a 50 MB
answer to a 32-token request, impossible usage numbers, answers cut mid-body, a replica that fails every
request while its /health answers. Each case ends in the right number or one clear error, fast."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import run_inprocess  # noqa: E402
from fake_openai_server import FakeOpenAIServer, answer_for  # noqa: E402
from test_server_faults import BF16, SECRET, generate, make_cfg, needle_answer, reqs  # noqa: E402,F401

from fp8eval.engines.base import EngineError  # noqa: E402
from fp8eval.engines.pool import build_server_engine  # noqa: E402
from fp8eval.engines.server import ServerEngine, transport  # noqa: E402

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # model=smollm2-135m's hf_id, as the server calls it


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(ServerEngine, "retry_backoff_s", 0.001)
    monkeypatch.setattr(ServerEngine, "retry_backoff_cap_s", 0.005)
    monkeypatch.setenv("FP8EVAL_TEST_KEY", SECRET)


def test_a_one_byte_per_second_answer_is_cut_by_the_overall_deadline():
    """Each byte arrives within the read timeout, so only the overall deadline can end the request."""
    with FakeOpenAIServer() as srv:
        srv.fault_fn = lambda body, attempt: "trickle"
        t0 = time.monotonic()
        with pytest.raises(EngineError, match=r"failed 1 times .*ReadTimeout: no complete answer within the 2 s "
                                              r"deadline \(engine.request_timeout_s\)"):
            generate(srv, reqs(1, 1), request_timeout_s=2, max_retries=0)
        took = time.monotonic() - t0
    assert 1.9 < took < 15, took  # ~2.6 s; a trickled answer of ~300 bytes would take 5 minutes


def test_the_deadline_holds_through_the_cli_with_request_timeout_5(tmp_path):
    """The issue's case: `engine.request_timeout_s=5` against a trickling server stops after ~5 s (one
    attempt) with one line, instead of hanging."""
    with FakeOpenAIServer(model=MODEL) as srv:
        srv.fault_fn = lambda body, attempt: "trickle"
        t0 = time.monotonic()
        with pytest.raises(EngineError, match="5 s deadline"):
            run_inprocess(tmp_path, ["engine=server", f"engine.base_url={srv.url}", "engine.request_timeout_s=5",
                                     "engine.max_retries=0", "kv=bf16", "baseline=none", "task.lengths=[512]",
                                     "task.depths=[0]", "task.needles_per_cell=1", "engine.concurrency=1"])
        took = time.monotonic() - t0
    assert took < 30, took  # ~7 s at load 9; the trickle alone would take minutes


@pytest.mark.parametrize("value", [0, -1, "nan", "inf"])
def test_request_timeout_must_be_positive(value):
    with FakeOpenAIServer() as srv:
        with pytest.raises(EngineError, match=r"engine.request_timeout_s=.*deadline above 0 s"):
            ServerEngine(make_cfg(srv.url, request_timeout_s=float(value)), BF16)
        assert srv.generation_calls == 0


def test_answer_limit_follows_max_tokens_and_n():
    small = transport.answer_limit(1, 32)
    assert small < 100_000 < 50 * 1024 * 1024
    assert transport.answer_limit(4, 32) > small and transport.answer_limit(1, 32768) > 2_000_000
    assert transport.answer_limit(1, None, 4096) == transport.answer_limit(1, 4096)
    assert transport.answer_limit(1, None) == transport.UNBOUNDED_ANSWER_BYTES


def test_a_50_mb_answer_to_a_32_token_request_is_refused():
    """Reading stops at the request's bound (~66 kB); after the retries the sequence is an error record
    naming the bound, never a 50 MB completion."""
    with FakeOpenAIServer() as srv:
        srv.fault_fn = lambda body, attempt: "huge"
        rq = reqs(1, 1)
        rq[0].sampling["max_tokens"] = 32
        t0 = time.monotonic()
        got = generate(srv, rq, max_retries=1)
        took = time.monotonic() - t0
    [choice] = got["q0"].choices
    assert choice.finish_reason == "error" and "bytes, the bound for this request" in choice.error
    assert choice.text == "" and took < 60  # ~2.3 s, most of it the server building 50 MB twice


def test_one_huge_answer_among_good_ones_is_retried_and_the_run_is_clean():
    with FakeOpenAIServer() as srv:
        srv.faults = ["huge"]
        got = generate(srv, reqs(3, 1), concurrency=1)
    assert srv.fault_counts == {"huge": 1}
    assert [got[f"q{i}"].choices[0].text for i in range(3)] == [
        answer_for([{"role": "user", "content": f"alpha beta q{i}"}], 0) for i in range(3)]


@pytest.mark.parametrize("fault", ["usage_negative", "usage_huge", "cached_huge"])
def test_impossible_usage_numbers_are_refused(fault):
    """Persistently: error records (no impossible count reaches a record); once: retried, clean."""
    with FakeOpenAIServer() as srv:
        srv.fault_fn = lambda body, attempt: fault
        got = generate(srv, reqs(2, 1), max_retries=1)
    for c in got.values():
        assert c.choices[0].finish_reason == "error" and "usage." in c.choices[0].error
        assert c.cached_prompt_tokens is None and c.prompt_tokens == 0
    with FakeOpenAIServer() as srv:
        srv.faults = [fault]
        got = generate(srv, reqs(2, 1), concurrency=1)
    assert all(c.choices[0].finish_reason == "stop" and 0 <= c.choices[0].output_tokens <= 16 for c in got.values())


def test_summary_numbers_stay_possible_with_a_lying_server(tmp_path):
    """Every answer's usage is impossible: the run records errors, and the summary's token figures stay
    possible (hit rate in [0, 1] or None, mean output tokens >= 0 or None)."""
    with FakeOpenAIServer(model=MODEL) as srv:
        srv.fault_fn = lambda body, attempt: ("usage_huge", "usage_negative", "cached_huge")[attempt % 3]
        s = run_inprocess(tmp_path, ["engine=server", f"engine.base_url={srv.url}", "engine.max_retries=1",
                                     "kv=bf16", "baseline=none", "task.lengths=[512]", "task.depths=[0,100]",
                                     "task.needles_per_cell=1"])
    arm = s["arms"]["bf16"]
    assert arm["n_errors"] == arm["n_records"] == 2 and arm["score"] is None
    assert arm["prefix_cache_hit_rate"] is None and arm["mean_output_tokens"] is None


def test_a_replica_that_cuts_every_answer_is_ejected_and_the_run_completes(tmp_path):
    """Two loopback replicas; one cuts every answer mid-body but answers /health. Its requests are retried
    on the other one, it is ejected after engine.eject_after failures, and the summary equals a clean
    single-server run and says so."""
    overrides = ["engine=server", "engine.max_retries=2", "engine.eject_after=2", "task.lengths=[512]",
                 "task.depths=[0,50,100]", "task.needles_per_cell=3", "sampling.temperature=0.6", "baseline=none",
                 "kv=bf16", "engine.api_key_env=FP8EVAL_TEST_KEY", "engine.concurrency=2"]
    with FakeOpenAIServer(model=MODEL) as bad, FakeOpenAIServer(model=MODEL) as good, \
            FakeOpenAIServer(model=MODEL) as clean:
        bad.fault_fn = lambda body, attempt: "cut"
        bad.answer_fn = good.answer_fn = clean.answer_fn = needle_answer
        t0 = time.monotonic()
        pooled = run_inprocess(tmp_path / "a", [*overrides, f"engine.base_urls.bf16=[{bad.url},{good.url}]"])
        took = time.monotonic() - t0
        alone = run_inprocess(tmp_path / "b", [*overrides, f"engine.base_url={clean.url}"])
    arm, ref = pooled["arms"]["bf16"], alone["arms"]["bf16"]
    for key in ("score", "n_samples", "n_records", "n_errors", "by_group"):
        assert arm[key] == ref[key], key
    assert arm["n_errors"] == 0 and arm["n_records"] == 9
    pool = arm["replica_pool"]
    assert pool["replicas"] == 2 and pool["ejected"] == 1 and pool["dropped"] == 0
    bad_stats, good_stats = pool["per_replica"]
    # ejected after two in a row; a request already in flight to it then (concurrency 2) fails too
    assert bad_stats["ejected"] and bad_stats["answered"] == 0
    assert bad_stats["failed_requests"] == bad.fault_counts["cut"] in (2, 3)
    assert good_stats["alive"] and good_stats["answered"] == 9
    assert "ejected after 2 failed requests in a row" in arm["engine_warnings"]["replica_dropped"][0]
    assert took < 30, took


def test_a_retry_avoids_the_replica_that_just_failed():
    """Replica 0 answers every generation with HTTP 500 and is never ejected (eject_after=100); with one
    retry per request, every request still succeeds: the retry goes to replica 1."""
    a, b = FakeOpenAIServer(), FakeOpenAIServer()
    with a, b:
        a.fault_fn = lambda body, attempt: "500"
        cfg = make_cfg(None, max_retries=1, eject_after=100, concurrency=2)
        cfg.engine.base_urls = {"bf16": [a.url, b.url]}
        pool = build_server_engine(cfg, BF16)
        try:
            got = {c.request_id: c for c in pool.generate(reqs(8, 1))}
            stats = pool.pool_stats()
        finally:
            pool.close()
    assert sorted(got) == [f"q{i}" for i in range(8)]
    assert all(c.choices[0].finish_reason == "stop" for c in got.values())
    assert a.fault_counts["500"] >= 1 and stats["ejected"] == 0
    assert stats["per_replica"][1]["answered"] == 8


def test_eject_after_must_be_positive():
    a, b = FakeOpenAIServer(), FakeOpenAIServer()
    with a, b:
        cfg = make_cfg(None, eject_after=0)
        cfg.engine.base_urls = {"bf16": [a.url, b.url]}
        with pytest.raises(EngineError, match="engine.eject_after=0"):
            build_server_engine(cfg, BF16)


def test_sdk_auth_and_headers_reach_every_endpoint():
    """api_key (from engine.api_key_env), engine.organization and engine.default_headers are sent as the
    OpenAI SDK sends them, on generation requests and on the plain ones (preflight, /tokenize)."""
    from fp8eval.engines.base import Request

    with FakeOpenAIServer() as srv:
        eng = ServerEngine(make_cfg(srv.url, organization="org-fp8", default_headers={"X-Team": "eval"}), BF16)
        try:
            eng.count_prompt_tokens(Request(id="t", messages=({"role": "user", "content": "a b"},), n=1, seeds=(1,),
                                              sampling={}))
            list(eng.generate(reqs(1, 1)))
        finally:
            eng.close()
    paths = {path for path, _ in srv.headers_seen}
    assert {"/v1/models", "/tokenize", "/v1/chat/completions"} <= paths
    for path, headers in srv.headers_seen:
        h = {k.lower(): v for k, v in headers.items()}
        assert h["authorization"] == f"Bearer {SECRET}", path
        assert h["openai-organization"] == "org-fp8" and h["x-team"] == "eval", path
    gen = next(h for p, h in srv.headers_seen if p == "/v1/chat/completions")
    assert any(k.lower().startswith("x-stainless") for k in gen)  # the official SDK sent it


def test_default_headers_must_be_text():
    with FakeOpenAIServer() as srv:
        with pytest.raises(EngineError, match="engine.default_headers must map header names to text"):
            ServerEngine(make_cfg(srv.url, default_headers={"X-Team": ["a"]}), BF16)


def test_plain_requests_have_the_deadline_too():
    """/tokenize (and the lm-eval scoring requests, same path: ServerEngine.post_json) trickled one byte a
    second: cut by the deadline, retried, then one clear error."""
    from fp8eval.engines.base import Request

    with FakeOpenAIServer() as srv:
        srv.hostile_paths["/tokenize"] = "trickle"
        eng = ServerEngine(make_cfg(srv.url, request_timeout_s=1.5, max_retries=1), BF16)
        t0 = time.monotonic()
        try:
            with pytest.raises(EngineError, match=r"/tokenize failed 2 times \(ReadTimeout: no complete answer"):
                eng.count_prompt_tokens(Request(id="t", messages=({"role": "user", "content": "a"},), n=1,
                                                seeds=(1,), sampling={}))
        finally:
            eng.close()
        took = time.monotonic() - t0
    assert took < 20, took  # ~3.5 s: two 1.5 s deadlines


def test_impossible_metrics_counters_give_no_prefill_figure():
    """engine_prefill comes from /metrics deltas; hits above the prompt tokens or negative deltas (a server
    restarted mid-run) give no figure rather than a hit rate outside [0, 1]."""
    from fp8eval.engines.vllm.stats import prefill_stats

    assert prefill_stats({"prompt_tokens": 100.0, "prefix_cache_hits": 25.0})["prefix_cache_hit_rate"] == 0.25
    for bad in ({"prompt_tokens": 100.0, "prefix_cache_hits": 3957783.0}, {"prompt_tokens": -5.0},
                {"prompt_tokens": 10.0, "prefix_cache_hits": -1.0}, {"prompt_tokens": float("inf")}):
        assert prefill_stats(bad) is None, bad
