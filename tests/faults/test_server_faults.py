"""engine=server against a misbehaving OpenAI-compatible server: every requested sequence comes back,
is retried, or is recorded as an error; another model is refused; credentials never show."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import run_inprocess  # noqa: E402
from fake_openai_server import FakeOpenAIServer, answer_for  # noqa: E402

from fp8eval.config import EngineConfig, KVConfig, ModelConfig, RunConfig, TaskConfig  # noqa: E402
from fp8eval.engines.base import EngineError, Request  # noqa: E402
from fp8eval.engines.server import ServerEngine, WrongModel  # noqa: E402

BF16 = KVConfig(name="bf16", engine_args={})
SECRET = "sk-test-3f9c2a71d0e84b55"


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(ServerEngine, "retry_backoff_s", 0.001)
    monkeypatch.setattr(ServerEngine, "retry_backoff_cap_s", 0.005)
    monkeypatch.setenv("FP8EVAL_TEST_KEY", SECRET)


def make_cfg(url: str, hf_id: str = "fake-model", **engine) -> RunConfig:
    engine.setdefault("request_timeout_s", 5.0)
    engine.setdefault("max_retries", 3)
    return RunConfig(model=ModelConfig(name="fake", hf_id=hf_id, max_model_len=4096), kv=BF16,
                     engine=EngineConfig(kind="server", base_url=url, api_key_env="FP8EVAL_TEST_KEY", **engine),
                     task=TaskConfig(name="none"))


def reqs(k: int, n: int) -> list[Request]:
    return [Request(id=f"q{i}", messages=({"role": "user", "content": f"alpha beta q{i}"},), n=n,
                    seeds=tuple(range(7 * i, 7 * i + n)), sampling={"temperature": 0.0, "max_tokens": 16})
            for i in range(k)]


def generate(srv: FakeOpenAIServer, requests: list[Request], **engine) -> dict:
    eng = ServerEngine(make_cfg(srv.url, **engine), BF16)
    try:
        return {c.request_id: c for c in eng.generate(requests)}
    finally:
        eng.close()


def _expected(i: int, n: int) -> list[str]:
    return [answer_for([{"role": "user", "content": f"alpha beta q{i}"}], j) for j in range(n)]


@pytest.mark.parametrize("fault", ["500", "malformed", "empty_choices", "short_choices", "null_choice",
                                   "no_choices"])
def test_a_broken_answer_is_retried_and_every_sequence_comes_back(fault):
    with FakeOpenAIServer() as srv:
        srv.faults = [fault] * 2
        got = generate(srv, reqs(4, 3), concurrency=1)
    assert srv.fault_counts == {fault: 2}
    for i in range(4):
        c = got[f"q{i}"]
        assert [ch.text for ch in c.choices] == _expected(i, 3)
        assert all(ch.finish_reason == "stop" for ch in c.choices)


def test_persistently_short_answers_keep_the_good_choices_and_error_the_missing_one():
    with FakeOpenAIServer() as srv:
        srv.fault_fn = lambda body, attempt: "short_choices"
        got = generate(srv, reqs(2, 3), max_retries=2)
    for i in range(2):
        c = got[f"q{i}"]
        assert len(c.choices) == 3
        assert [ch.text for ch in c.choices[:2]] == _expected(i, 3)[:2]
        assert c.choices[2].finish_reason == "error" and "missing" in c.choices[2].error


def test_persistently_malformed_answers_become_error_records_not_a_crash():
    with FakeOpenAIServer() as srv:
        srv.fault_fn = lambda body, attempt: "malformed" if attempt % 2 else "null_choice"
        got = generate(srv, reqs(3, 2), max_retries=3)
    assert srv.generation_calls == 3 * 4
    # the last attempt's answer had a null first choice: that sequence is an error, the other one is kept
    assert [[ch.finish_reason for ch in c.choices] for c in got.values()] == [["error", "stop"]] * 3
    with FakeOpenAIServer() as srv:
        srv.fault_fn = lambda body, attempt: "malformed"
        got = generate(srv, reqs(2, 2), max_retries=1)
    assert all(ch.finish_reason == "error" and "malformed" in ch.error for c in got.values() for ch in c.choices)


def test_another_model_in_an_answer_stops_the_run():
    with FakeOpenAIServer() as srv:
        srv.faults = ["other_model"]
        with pytest.raises(WrongModel, match="some-other-model"):
            generate(srv, reqs(3, 1), concurrency=1)


def test_another_model_is_refused_at_preflight():
    with FakeOpenAIServer(model="other/served-model") as srv:
        with pytest.raises(EngineError, match="not the configured model"):
            ServerEngine(make_cfg(srv.url, hf_id="Qwen/Qwen3-30B-A3B-Instruct-2507"), BF16)
        # the same weights under another served name are accepted when named explicitly
        ServerEngine(make_cfg(srv.url, hf_id="Qwen/Qwen3-30B-A3B-Instruct-2507",
                              served_model_name="other/served-model"), BF16).close()


def test_credentials_in_the_url_are_redacted_in_errors():
    from fp8eval.engines.server import free_loopback_port

    port = free_loopback_port()
    with pytest.raises(EngineError) as info:
        ServerEngine(make_cfg(f"http://alice:hunter2@127.0.0.1:{port}"), BF16)
    assert "hunter2" not in str(info.value) and "alice" not in str(info.value)
    assert "http://***@127.0.0.1" in str(info.value)


def needle_answer(messages, index, seed):
    """A model that finds the needle except for one seed in three (so the score is not trivially 1)."""
    from fp8eval.engines.fake import rule_needle

    if (int(seed) + index) % 3 == 0:
        return "I don't know."
    return rule_needle(Request(id="x", messages=tuple(messages), n=1, seeds=(seed,), sampling={}), index)


def test_runner_over_a_faulty_server_gives_the_clean_number(tmp_path, monkeypatch):
    """1 in 4 calls broken in some way: the summary equals a clean server's, errors 0."""
    faults = ["500", "malformed", "empty_choices", "short_choices", "null_choice", "no_choices"]

    def sometimes(body, attempt):
        return faults[hash(str(body.get("seed"))) % len(faults)] if attempt == 1 and body["seed"] % 4 == 0 else None

    overrides = ["engine=server", "engine.max_retries=3", "task.lengths=[512]", "task.depths=[0,50,100]",
                 "task.needles_per_cell=3", "task.repeats=2", "sampling.temperature=0.6", "baseline=none", "kv=bf16",
                 "engine.api_key_env=FP8EVAL_TEST_KEY"]
    model = "HuggingFaceTB/SmolLM2-135M-Instruct"  # model=smollm2-135m's hf_id, as the server calls it
    with FakeOpenAIServer(model=model) as clean, FakeOpenAIServer(model=model) as broken:
        broken.fault_fn = sometimes
        clean.answer_fn = broken.answer_fn = needle_answer
        a = run_inprocess(tmp_path / "a", [*overrides, f"engine.base_url={clean.url}"])
        b = run_inprocess(tmp_path / "b", [*overrides, f"engine.base_url={broken.url}"])
    assert sum(broken.fault_counts.values()) > 0
    arm_a, arm_b = a["arms"]["bf16"], b["arms"]["bf16"]
    for key in ("score", "n_samples", "n_repeats", "n_records", "n_errors", "by_group"):
        assert arm_a[key] == arm_b[key], key
    assert arm_b["n_errors"] == 0 and arm_b["n_records"] == 18 and 0.3 < arm_b["score"] < 0.9


def test_replica_pool_retries_broken_answers_too():
    """The replica pool (fp8eval.engines.pool) uses the same checked attempt: broken answers are retried,
    persistent ones kept as error choices, never lost."""
    from fp8eval.engines.pool import build_server_engine

    a, b = FakeOpenAIServer(), FakeOpenAIServer()
    with a, b:
        a.faults = ["malformed", "short_choices", "null_choice"]
        b.faults = ["empty_choices", "500"]
        cfg = make_cfg(None)
        cfg.engine.base_urls = {"bf16": [a.url, b.url]}
        pool = build_server_engine(cfg, BF16)
        try:
            got = {c.request_id: c for c in pool.generate(reqs(6, 2))}
        finally:
            pool.close()
    assert sorted(got) == [f"q{i}" for i in range(6)]
    for i in range(6):
        assert [ch.text for ch in got[f"q{i}"].choices] == _expected(i, 2)
