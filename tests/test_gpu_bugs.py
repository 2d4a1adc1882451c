"""Issue 18's three bugs, on CPU: greedy repeats, a vLLM start-up failure's root cause, plain-text prompts."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import compose

from fp8eval.engines.base import Request
from fp8eval.engines.prompting import plain_prompt_text, prompt_text_for
from fp8eval.engines.vllm import logscan
from fp8eval.runner import RunError, Runner

# What vLLM 0.26 logs when kv=fp8_e5m2 leaves only TRITON_ATTN on Hopper (the shape of a captured log:
# the engine core's traceback with its process/level prefixes, then the front end's wrapper).
E5M2_LOG = """\
(EngineCore_DP0 pid=4242) INFO 12-01 10:00:01 [cuda.py:350] Using TRITON_ATTN attention backend.
(EngineCore_DP0 pid=4242) ERROR 12-01 10:00:02 [core.py:708] EngineCore failed to start.
(EngineCore_DP0 pid=4242) ERROR 12-01 10:00:02 [core.py:708] Traceback (most recent call last):
(EngineCore_DP0 pid=4242) ERROR 12-01 10:00:02 [core.py:708]   File "/tmp/site/vllm/v1/engine/core.py", line 699, in run_engine_core
(EngineCore_DP0 pid=4242) ERROR 12-01 10:00:02 [core.py:708]     engine_core = EngineCoreProc(*args, **kwargs)
(EngineCore_DP0 pid=4242) ERROR 12-01 10:00:02 [core.py:708]   File "/tmp/site/vllm/v1/attention/backends/triton_attn.py", line 262, in __init__
(EngineCore_DP0 pid=4242) ERROR 12-01 10:00:02 [core.py:708]     assert self.kv_cache_dtype in {"fp8", "fp8_e4m3", "nvfp4"}
(EngineCore_DP0 pid=4242) ERROR 12-01 10:00:02 [core.py:708] AssertionError
(EngineCore_DP0 pid=4242) Process EngineCore_DP0:
(EngineCore_DP0 pid=4242) Traceback (most recent call last):
(EngineCore_DP0 pid=4242)   File "/tmp/site/vllm/v1/attention/backends/triton_attn.py", line 262, in __init__
(EngineCore_DP0 pid=4242)     assert self.kv_cache_dtype in {"fp8", "fp8_e4m3", "nvfp4"}
(EngineCore_DP0 pid=4242) AssertionError
Traceback (most recent call last):
  File "/tmp/g/proj/fp8eval/engines/vllm_offline.py", line 320, in start
    self.llm = LLM(**engine_args)
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_greedy_repeats_are_refused_before_any_engine(tmp_path):
    cfg = compose([f"records_dir={tmp_path}", "engine=reference", "task=math500", "task.repeats=5"])
    with pytest.raises(RunError) as err:
        Runner(cfg, tmp_path / "run", out=lambda *a: None).run()
    msg = str(err.value)
    assert "task.repeats=5" in msg and "model smollm2-135m's sampling defaults" in msg
    assert "sampling.temperature=" in msg and "task.repeats=1" in msg
    assert not any(tmp_path.iterdir())  # nothing built, nothing written
    # an explicit temperature, or one repeat, passes the check
    from fp8eval.runner import check_greedy_repeats, effective_sampling

    ok = compose(["engine=reference", "task=math500", "task.repeats=5", "sampling.temperature=0.6"])
    check_greedy_repeats(ok, effective_sampling(ok))
    one = compose(["engine=reference", "task=math500", "task.repeats=1"])
    check_greedy_repeats(one, effective_sampling(one))


def test_root_cause_and_fix_of_e5m2_on_hopper():
    cause = logscan.root_cause(E5M2_LOG)
    assert cause.line.startswith("AssertionError: assert self.kv_cache_dtype in")
    assert cause.location == "vllm/v1/attention/backends/triton_attn.py:262 in __init__"
    line = logscan.root_cause_line(E5M2_LOG)
    hint = logscan.known_failure_hint(line, "fp8_e5m2")
    assert "kv=fp8" in hint and "FlashInfer" in hint
    assert logscan.known_failure_hint(line, "fp8") == ""  # the hint is about e5m2 only
    # a message-carrying exception keeps its message; wrappers are never the cause
    text = ('  File "/x/vllm/worker.py", line 5, in load\n    raise ValueError("bad")\n'
            "ValueError: bad thing\nRuntimeError: Engine core initialization failed. See root cause above.\n")
    assert logscan.root_cause_line(text) == "ValueError: bad thing (at vllm/worker.py:5 in load)"


def test_vllm_startup_error_on_a_gpu_names_cause_location_and_fix(monkeypatch, tmp_path):
    from fp8eval.engines.vllm import kvcheck
    from fp8eval.engines.vllm_offline import VLLMOfflineEngine

    eng = object.__new__(VLLMOfflineEngine)
    eng.args = {"model": "m", "kv_cache_dtype": "fp8_e5m2"}
    eng.startup_log = E5M2_LOG
    eng.log_path = tmp_path / "vllm.log"
    eng.python = "python3"
    monkeypatch.setattr(kvcheck, "runs_on_cpu", lambda args: False)
    msg = eng._startup_error({"op": "error", "type": "RuntimeError",
                              "message": "Engine core initialization failed. See root cause above."})
    assert "AssertionError: assert self.kv_cache_dtype in" in msg and "triton_attn.py:262" in msg
    assert "kv=fp8" in msg and "FlashInfer" in msg and str(eng.log_path) in msg


def test_base_model_prompts_are_plain_text_for_every_engine(tmp_path):
    msgs = ({"role": "user", "content": "A"}, {"role": "user", "content": "B"})
    assert plain_prompt_text(msgs) == "A\n\nB\n\n"
    assert prompt_text_for(msgs, None, chat_template=False) == "A\n\nB\n\n"
    assert prompt_text_for(msgs, None, chat_template=True) is None
    assert prompt_text_for(msgs, "raw", chat_template=False) == "raw"
    # the runner builds the request every engine gets
    from fp8eval.tasks.base import Prompt

    cfg = compose(["model=gemma3-270m", "engine=fake"])
    req = Runner(cfg, tmp_path).request("r", Prompt(messages=list(msgs)), 1, [0])
    assert req.prompt_text == "A\n\nB\n\n"
    chat = compose(["model=smollm2-135m", "engine=fake"])
    assert Runner(chat, tmp_path).request("r", Prompt(messages=list(msgs)), 1, [0]).prompt_text is None


class _NoTemplateTokenizer:
    chat_template = None

    def apply_chat_template(self, *a, **k):
        raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set")

    def encode(self, text, add_special_tokens=True):
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]


def test_vllm_worker_falls_back_to_the_same_plain_text():
    from fp8eval.engines.vllm_offline import _Worker

    w = _Worker(out=None)
    w.tokenizer = _NoTemplateTokenizer()
    req = {"messages": [{"role": "user", "content": "hi"}]}
    assert w.prompt_ids(req) == [1] + [ord(c) for c in "hi\n\n"]
    assert w.prompt_ids({"prompt_text": "hi\n\n"}) == w.prompt_ids(req)


def test_request_json_carries_prompt_text():
    from fp8eval.engines.vllm_offline import _request_json

    r = Request(id="x", messages=({"role": "user", "content": "a"},), n=1, seeds=(0,), sampling={},
                chat_template_kwargs={}, prompt_text="a\n\n")
    assert _request_json(r)["prompt_text"] == "a\n\n"


def test_emulation_knobs_in_fingerprints_only_where_they_change_a_number(tmp_path):
    """Records made before kv.attention / kv.accumulation existed (kv_only, exact) keep their fingerprint;
    the default fa3_fp8 is another arm; a BF16 arm's fingerprint never carries the knobs (nothing is
    emulated on a BF16 cache)."""
    import json

    from conftest import run_inprocess

    fast = ["engine=fake", "task.lengths=[1024]", "task.depths=[0]", "report=false"]
    legacy = run_inprocess(tmp_path, fast + ["kv.attention=kv_only"], "a")
    default = run_inprocess(tmp_path, fast, "b")
    meta = lambda s, kv: json.loads(Path(s["arms"][kv]["records"]).with_suffix(".arm.json").read_text())  # noqa: E731
    kv_legacy, kv_default = meta(legacy, "fp8")["material"]["kv"], meta(default, "fp8")["material"]["kv"]
    assert "attention" not in kv_legacy and "accumulation" not in kv_legacy
    assert kv_default["attention"] == "fa3_fp8" and "accumulation" not in kv_default
    assert legacy["arms"]["fp8"]["fingerprint"] != default["arms"]["fp8"]["fingerprint"]
    assert "attention" not in meta(default, "bf16")["material"]["kv"]
    assert legacy["arms"]["bf16"]["fingerprint"] == default["arms"]["bf16"]["fingerprint"]
