"""Scoring requests on vLLM (fp8eval.engines.loglikelihood): offline through `prompt_logprobs`, a server
through its /tokenize endpoint and `/v1/completions` with `echo` and `logprobs`.

Both tokenize each (context, continuation) as lm-eval does (loglikelihood.encode_pair) and send the token
ids, so the server's or the worker's tokenizer decides, never a guess here. `is_greedy` is lm-eval's: the
continuation token is the most likely one at every position (offline from the logprob dicts, which hold
the prompt token and the top-1 token; the server from its top_logprobs, compared as token text as
lm-eval's API models do).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Iterable, Iterator

from fp8eval.engines import loglikelihood as ll
from fp8eval.engines.base import Completion, EngineError, Request


def _encoder(tok):
    return lambda text: list(tok.encode(text, add_special_tokens=False))


# --- offline -----------------------------------------------------------------------------------------------
def offline_loglikelihood(engine, requests: Iterable[Request], request_json, completion_from_json
                          ) -> Iterator[Completion]:
    """The parent side (VLLMOfflineEngine.loglikelihood): one "score" message, one reply with every completion;
    the engine's own JSON converters are passed in."""
    with engine._lock:
        engine._send({"op": "score", "requests": [request_json(r) for r in requests]})
        msg = engine._recv()
    if msg.get("op") == "error":
        raise EngineError(f"vLLM failed while scoring: {msg.get('type')}: {msg.get('message')}. "
                          f"Log: {engine.log_path}. Records written so far are kept; rerun to resume.")
    for comp in msg["completions"]:
        yield completion_from_json(comp)


def worker_reply(worker, msg: dict) -> dict:
    """The worker side of a "score" message (runs in the vLLM worker process)."""
    return {"op": "scored", "completions": worker_score(worker.llm, worker.tokenizer, worker.max_model_len,
                                                         msg["requests"])}


def worker_score(llm, tok, max_model_len: int, requests: list[dict]) -> list[dict]:
    """Completion dicts (as the worker sends them) for scoring requests given as request JSON."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    encode, bos = _encoder(tok), ll.prefix_token_id(tok)
    prompts, where = [], []
    encoded: dict[str, list[tuple[list[int], list[int]]]] = {}
    for r in requests:
        pairs = [ll.encode_pair(encode, c, x, bos) for c, x in r["logprob_pairs"]]
        pairs = [(ctx or [bos], cont) for ctx, cont in pairs]
        req = Request(id=r["id"], messages=(), n=r["n"], seeds=tuple(r["seeds"]), sampling={})
        ll.check_fits(req, (len(a) + len(b) for a, b in pairs), max_model_len)
        encoded[r["id"]] = pairs
        for j, (ctx, cont) in enumerate(pairs):
            if cont:
                prompts.append(TokensPrompt(prompt_token_ids=ctx + cont))
                where.append((r["id"], j))
    t0 = time.monotonic()
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1, detokenize=False)
    outputs = llm.generate(prompts, params, use_tqdm=False) if prompts else []
    results: dict[str, dict[int, tuple[float, bool]]] = {rid: {} for rid in encoded}
    for (rid, j), out in zip(where, outputs, strict=True):
        ctx, cont = encoded[rid][j]
        results[rid][j] = continuation_score(ctx + cont, len(ctx), out.prompt_logprobs)
    latency = time.monotonic() - t0
    out_dicts = []
    for r in requests:
        pairs = [results[r["id"]].get(j, (0.0, True)) for j in range(len(encoded[r["id"]]))]
        req = Request(id=r["id"], messages=(), n=r["n"], seeds=tuple(r["seeds"]), sampling={})
        comp = ll.completion(req, pairs, sum(len(a) + len(b) for a, b in encoded[r["id"]]), latency, None)
        out_dicts.append(dataclasses.asdict(comp))
    return out_dicts


def continuation_score(tokens: list[int], ctxlen: int, prompt_logprobs: list) -> tuple[float, bool]:
    """Sum of the continuation tokens' logprobs and whether each was the most likely token; prompt_logprobs
    is vLLM's per-position {token_id: Logprob or float} (None at position 0)."""
    total, greedy = 0.0, True
    for pos in range(ctxlen, len(tokens)):
        row = {t: getattr(v, "logprob", v) for t, v in (prompt_logprobs[pos] or {}).items()}
        total += float(row[tokens[pos]])
        greedy = greedy and max(row, key=row.get) == tokens[pos]
    return total, greedy


# --- server ----------------------------------------------------------------------------------------------
def server_loglikelihood(engine, requests: Iterable[Request]) -> Iterator[Completion]:
    """One /tokenize pair and one echo completion per (context, continuation), sequentially: scoring
    requests are single forward passes, far cheaper than the generation they accompany."""
    prefix: list[int | None] = []

    def tokenize(text: str) -> list[int]:
        r = engine.post_json("/tokenize", {"model": engine.model_id, "prompt": text, "add_special_tokens": False},
                             _refused)
        return [int(t) for t in r["tokens"]]

    def bos() -> int | None:
        if not prefix:  # the server's BOS (else EOS) id: what a template-free tokenisation of "" adds
            r = engine.post_json("/tokenize", {"model": engine.model_id, "prompt": "", "add_special_tokens": True},
                                 _refused)
            prefix.append(int(r["tokens"][0]) if r.get("tokens") else None)
        return prefix[0]

    for req in requests:
        t0 = time.monotonic()
        pairs, n_tokens = [], 0
        for c, x in req.logprob_pairs:
            ctx, cont = ll.encode_pair(tokenize, c, x, bos() if c == "" else None)
            ctx = ctx or [bos()]
            ll.check_fits(req, [len(ctx) + len(cont)], engine.max_model_len())
            n_tokens += len(ctx) + len(cont)
            if not cont:
                pairs.append((0.0, True))
                continue
            body = {"model": engine.model_id, "prompt": ctx + cont, "max_tokens": 1, "temperature": 0,
                    "logprobs": 1, "echo": True}
            lp = engine.post_json("/v1/completions", body, _refused)["choices"][0]["logprobs"]
            pairs.append(echo_score(lp, len(ctx), len(cont)))
        yield ll.completion(req, pairs, n_tokens, time.monotonic() - t0, None)


def echo_score(logprobs: dict[str, Any], ctxlen: int, n_cont: int) -> tuple[float, bool]:
    """From an echo completion's logprobs (tokens, token_logprobs, top_logprobs; the prompt's tokens first,
    then the one generated token): the continuation's sum and whether each was the top token."""
    span = range(ctxlen, ctxlen + n_cont)
    total = sum(float(logprobs["token_logprobs"][i]) for i in span)
    greedy = True
    for i in span:
        top = logprobs["top_logprobs"][i] or {}
        if top and max(top, key=top.get) != logprobs["tokens"][i]:
            greedy = False
    return total, greedy


def _refused(status: int, text: str) -> str:
    return (f"the server refused a scoring request: HTTP {status} {text}. Loglikelihood needs a vLLM server "
            "(/tokenize, echo with logprobs).")

