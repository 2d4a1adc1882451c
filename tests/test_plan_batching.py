"""Planning counts prompt tokens in batches (issue 26: the harness's share of a GPU run): NIAH's haystack fits
run in step for every sample, each round counted in one call, and give exactly the prompts of one-by-one
fitting; the runner's counter sends a batch to an engine that can take one; the vLLM worker's batch count
equals its one-by-one count."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import compose, run_inprocess

from fp8eval.core.types import Prompt
from fp8eval.engines.base import EngineBase
from fp8eval.engines.fake import FakeEngine
from fp8eval.tasks.base import SkipSample, TaskContext
from fp8eval.tasks.niah import NiahConfig, NiahTask, haystack
from fp8eval.token_counts import PromptCounter, TokenCountCache


def _tokens(prompt: Prompt) -> int:
    """A deterministic, non-linear stand-in tokenizer: words plus a penalty for digits and punctuation."""
    text = prompt.messages[0]["content"]
    return len(text.split()) + sum(c.isdigit() or c in ".,;:" for c in text) // 3 + 12


def _task(lengths, count_many=None, calls=None) -> NiahTask:
    def count(p):
        if calls is not None:
            calls.append(1)
        return _tokens(p)

    cfg = NiahConfig(lengths=lengths, depths=[0.0, 33.0, 100.0], needles_per_cell=2)
    return NiahTask(cfg, TaskContext(count_tokens=count, count_many=count_many, max_model_len=9000, model_name="t",
                                     seed=7, max_tokens=32))


def _outcome(task: NiahTask, sample):
    try:
        return task.prompt(sample, 0).hash()
    except SkipSample as e:
        return f"skip: {e}"


def test_prepared_prompts_equal_one_by_one_fitting_including_skips():
    lengths = [20, 300, 1024, 4000]  # 20 tokens: the prompt without filler is longer, a skip
    alone = _task(lengths)
    want = {s.id: _outcome(alone, s) for s in alone.samples()}
    rounds: list[int] = []

    def many(prompts):
        rounds.append(len(prompts))
        return [_tokens(p) for p in prompts]

    single_calls: list[int] = []
    batched = _task(lengths, count_many=many, calls=single_calls)
    samples = batched.samples()
    batched.prepare(samples[3:])  # a shard's share first: the rest is fitted alone, as before
    got = {s.id: _outcome(batched, s) for s in samples}
    assert got == want
    assert any(v.startswith("skip") for v in want.values()) and any(not v.startswith("skip") for v in want.values())
    assert len(rounds) <= 9 and max(rounds) == len(samples) - 3  # one batch per round, not one call per prompt
    assert single_calls  # the calibration probe and the first three samples were counted one by one
    # prepare() keeps each result for one prompt() call; asked again, the prompt is fitted again, identically
    assert _outcome(batched, samples[5]) == want[samples[5].id]


def _haystack_before(n_chars: int) -> str:
    """haystack_text as it was before it stopped copying the whole last book."""
    parts, have = [], 0
    while have < n_chars:
        for name in haystack.BOOKS:
            body = haystack.book_body(str(haystack.HAYSTACK_DIR / name))
            parts.append(body)
            have += len(body) + 2
            if have >= n_chars:
                break
    return "\n\n".join(parts)[:n_chars]


def test_haystack_text_is_unchanged():
    lens = [len(haystack.book_body(str(haystack.HAYSTACK_DIR / b))) for b in haystack.BOOKS]
    total = sum(lens) + 2 * len(lens)
    for n in (0, 1, 500, lens[0] - 1, lens[0], lens[0] + 1, lens[0] + 2, lens[0] + 3, lens[0] + lens[1] + 3,
              total - 1, total, total + 1, total + 2, total + 3, 2 * total + 5):
        assert haystack.haystack_text(n) == _haystack_before(n), n


class _BatchEngine:
    def __init__(self):
        self.single, self.batches = 0, []

    def count_prompt_tokens(self, request):
        self.single += 1
        return len(request.messages[0]["content"])

    def count_prompt_tokens_many(self, requests):
        self.batches.append(len(requests))
        return [len(r.messages[0]["content"]) for r in requests]


def _prompt(text: str) -> Prompt:
    return Prompt(messages=({"role": "user", "content": text},))


def test_counter_batches_unknown_prompts_once_each_and_keeps_them_on_disk(tmp_path):
    from fp8eval.core.types import Request

    def request_of(p):
        return Request(id="count", messages=p.messages, n=1, seeds=(0,), sampling={})

    engine = _BatchEngine()
    disk = TokenCountCache(tmp_path, {"tokenizer": "x"})
    counter = PromptCounter(engine, request_of, disk)
    assert counter.many([_prompt("abc"), _prompt("de"), _prompt("abc")]) == [3, 2, 3]
    assert engine.batches == [2] and engine.single == 0
    assert counter(_prompt("abc")) == 3 and counter(_prompt("wxyz")) == 4
    assert engine.single == 1 and counter.engine_calls == 2
    fresh = PromptCounter(engine, request_of, TokenCountCache(tmp_path, {"tokenizer": "x"}))
    assert fresh.many([_prompt("abc"), _prompt("de"), _prompt("wxyz")]) == [3, 2, 4]
    assert engine.batches == [2] and engine.single == 1  # all from disk


def test_counter_refuses_a_batch_answer_of_the_wrong_length():
    from fp8eval.engines.base import EngineError

    engine = _BatchEngine()
    engine.count_prompt_tokens_many = lambda requests: [1]
    counter = PromptCounter(engine, lambda p: SimpleNamespace(messages=p.messages), None)
    with pytest.raises(EngineError, match="1 of the 2 prompts"):
        counter.many([_prompt("a"), _prompt("b")])


def test_runner_plan_on_fake_engine_matches_one_by_one_planning(tmp_path):
    from fp8eval.arms import open_engines
    from fp8eval.runner import Runner
    from fp8eval.tasks import task_class

    cfg = compose([f"records_dir={tmp_path}", "engine=fake", "task=niah", "task.lengths=[1024,4096]",
                   "task.depths=[0,50,100]", "task.needles_per_cell=2", "model=smollm2-135m", "progress=false"])
    runner = Runner(cfg, tmp_path / "run")
    arm = runner.arms()[-1]
    with open_engines(cfg) as door:
        with door.engine(arm) as engine:
            engine.count_prompt_tokens_many = lambda reqs: [engine.count_prompt_tokens(r) for r in reqs]
            counter = runner.token_counter(engine)
            plans = []
            for many in (counter.many, None):
                ctx = TaskContext(count_tokens=counter, count_many=many, max_model_len=engine.max_model_len(),
                                  model_name=cfg.model.name, seed=cfg.seed, max_tokens=64)
                task = task_class("niah")(cfg.task, ctx)
                plans.append([(it.sample.id, it.prompt_hash, it.prompt_tokens, it.skip_reason)
                              for it in runner.plan(task, engine)])
    assert plans[0] == plans[1] and len(plans[0]) == 12


def _hf_tokenizer():
    transformers = pytest.importorskip("transformers")
    from fp8eval.core.paths import cache_root

    found = sorted((cache_root() / "models").glob("smollm2-135m-*/tokenizer.json"))
    if not found:
        pytest.skip("the embedded SmolLM2-135M tokenizer is not unpacked here")
    return transformers.AutoTokenizer.from_pretrained(str(found[0].parent))


def test_vllm_worker_batch_count_equals_one_by_one():
    from fp8eval.engines.vllm import prompt_ops

    worker = SimpleNamespace(tokenizer=_hf_tokenizer(), dummy=False)
    reqs = [{"messages": [{"role": "user", "content": haystack.haystack_text(n)}]} for n in (0, 7, 900, 5000)]
    reqs += [{"messages": [], "prompt_text": "Once upon a time " * k} for k in (1, 40)]
    want = [len(prompt_ops.prompt_ids(worker, r)) for r in reqs]
    assert prompt_ops.count_many(worker, reqs) == want
    assert getattr(worker, "batch_counts_ok", True)


def test_vllm_worker_falls_back_when_the_batch_call_disagrees():
    from fp8eval.engines.vllm import prompt_ops

    tok = _hf_tokenizer()

    class Skewed:
        is_fast = True

        def __getattr__(self, name):
            return getattr(tok, name)

        def __call__(self, texts, **kw):  # a batch call that adds a token: must not be trusted
            return {"input_ids": [ids + [0] for ids in tok(texts, **kw)["input_ids"]]}

    worker = SimpleNamespace(tokenizer=Skewed(), dummy=False)
    reqs = [{"messages": [{"role": "user", "content": haystack.haystack_text(n)}]} for n in (10, 300)]
    assert prompt_ops.count_many(worker, reqs) == [len(prompt_ops.prompt_ids(worker, r)) for r in reqs]
    assert worker.batch_counts_ok is False


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


_FAKE_COUNT = FakeEngine.count_prompt_tokens  # before any test patches it


class _Helper(EngineBase):
    """A stand-in tokenizer-only worker: counts as the fake engine does, after a short load (the optional half of
    the engine protocol, a batch count among it, from EngineBase)."""

    def __init__(self, same: bool):
        self.same, self.closed, self.counted = same, False, 0

    def wait_ready(self, timeout_s):
        time.sleep(0.1)

    def max_model_len(self):
        return 8192

    def count_prompt_tokens(self, request):
        self.counted += 1
        return _FAKE_COUNT(None, request)

    def same_counts_as(self, engine):
        return self.same

    def close(self):
        self.closed = True


def _records(summary):
    import json

    out = {}
    for name, arm in summary["arms"].items():
        rows = [json.loads(line) for line in Path(arm["records"]).read_text().splitlines()]
        out[name] = sorted((r["sample_id"], r["prompt_hash"], r["prompt_tokens"]) for r in rows)
    return out


@pytest.mark.parametrize("same", [True, False])
def test_runner_plans_while_the_engine_starts_and_uses_it_only_if_the_engine_counts_the_same(
        tmp_path, monkeypatch, same):
    import fp8eval.engines as engines

    overrides = ["engine=fake", "task.lengths=[1024,2048]", "task.depths=[0,100]"]
    plain = run_inprocess(tmp_path / "plain", overrides)
    helpers = []
    monkeypatch.setattr(engines, "start_early_counter", lambda cfg, arm, kind: helpers.append(_Helper(same))
                        or helpers[-1])
    slow_start = FakeEngine.__init__

    def starting(self, *a, **kw):
        time.sleep(1.0)  # the engine's start, during which the plan is made
        slow_start(self, *a, **kw)

    monkeypatch.setattr(FakeEngine, "__init__", starting)
    engine_counts = []
    count = FakeEngine.count_prompt_tokens
    monkeypatch.setattr(FakeEngine, "count_prompt_tokens", lambda self, r: engine_counts.append(1) or count(self, r))
    early = run_inprocess(tmp_path / "early", overrides)
    for _ in range(250):  # the helper is closed in the background
        if helpers[0].closed:
            break
        time.sleep(0.02)
    assert len(helpers) == 1 and helpers[0].closed and helpers[0].counted > 0  # one plan, the first arm's start
    assert _records(early) == _records(plain)
    assert {a["fingerprint"] for a in early["arms"].values()} == {a["fingerprint"] for a in plain["arms"].values()}
    t = early["timing"]
    assert "plan_check" in t["harness_parts"]
    if same:  # the plan ran inside the first start: overlapped, not in harness_s
        assert t["harness_overlapped_s"] >= 0.5 * t["harness_parts"]["plan"] > 0
    # the fake engine counts each prompt it answers; planning with it adds a count per prompt tried
    answered = sum(a["requests_sent"] for a in early["arms"].values())
    assert (len(engine_counts) == answered) if same else (len(engine_counts) > answered)
