"""Scoring requests (Request.logprob_pairs) on the vLLM engines without vLLM: the offline worker's
prompt_logprobs arithmetic with a stub vllm, the server's /tokenize + echo path against the fake server."""

from __future__ import annotations

import sys
import types

import pytest
from fake_openai_server import FakeOpenAIServer, echo_logprob, token_id, word_tokens
from test_server_engine import BF16, make_cfg

from fp8eval.arms import arm_spec
from fp8eval.engines.base import Request, decode_loglikelihoods
from fp8eval.engines.server import ServerEngine


class Logprob:
    def __init__(self, logprob: float):
        self.logprob = logprob


def test_continuation_score_from_prompt_logprobs():
    from fp8eval.engines.vllm_scoring import continuation_score

    tokens = [5, 6, 7, 8]
    plp = [None, {6: Logprob(-1.0)}, {7: Logprob(-0.5), 9: Logprob(-0.1)}, {8: Logprob(-0.25)}]
    assert continuation_score(tokens, 2, plp) == (-0.75, False)  # 9 beat 7 at position 2
    assert continuation_score(tokens, 3, plp) == (-0.25, True)


def test_worker_score_with_a_stub_vllm(monkeypatch):
    from fp8eval.engines.vllm_scoring import worker_score

    class Tok:
        bos_token_id, eos_token_id = 1, 2

        def encode(self, text, add_special_tokens=False):
            return [token_id(t) for t in word_tokens(text)]

    class LLM:
        def generate(self, prompts, params, use_tqdm=False):
            assert params["prompt_logprobs"] == 1
            outs = []
            for p in prompts:
                ids = p["prompt_token_ids"]
                outs.append(types.SimpleNamespace(prompt_logprobs=[None] + [
                    {b: Logprob(echo_logprob(a, b)), a + 1: Logprob(echo_logprob(a, a + 1))}
                    for a, b in zip(ids, ids[1:])]))
            return outs

    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = lambda **kw: kw
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    req = {"id": "r", "n": 2, "seeds": [0, 1], "logprob_pairs": [["Question: sky?\nAnswer:", " blue"],
                                                                  ["", "plain text"]]}
    (comp,) = worker_score(LLM(), Tok(), 4096, [req])
    got = decode_loglikelihoods(comp["choices"][0]["text"])
    assert len(comp["choices"]) == 2 and comp["choices"][0] == comp["choices"][1]
    ctx = [token_id(t) for t in word_tokens("Question: sky?\nAnswer:")]
    assert got[0] == (echo_logprob(ctx[-1], token_id(" blue")), False)
    plain = [token_id(t) for t in word_tokens("plain text")]
    assert got[1][0] == echo_logprob(1, plain[0]) + echo_logprob(plain[0], plain[1])  # after the BOS


def test_server_echo_logprobs():
    with FakeOpenAIServer() as srv:
        eng = ServerEngine(make_cfg(srv.url), arm_spec(make_cfg(srv.url), BF16))
        req = Request(id="r", messages=(), n=1, seeds=(0,), sampling={},
                      logprob_pairs=(("The sky is ", "blue today"), ("", "word")))
        (comp,) = list(eng.loglikelihood([req]))
        eng.close()
    got = decode_loglikelihoods(comp.choices[0].text)
    # the context's trailing space moves to the continuation, as lm-eval encodes pairs
    ctx = [token_id(t) for t in word_tokens("The sky is")]
    cont = [token_id(t) for t in word_tokens("The sky is blue today")][len(ctx):]
    want = echo_logprob(ctx[-1], cont[0]) + echo_logprob(cont[0], cont[1])
    assert got[0] == (pytest.approx(want), False)
    assert got[1] == (pytest.approx(echo_logprob(1, token_id("word"))), False)
