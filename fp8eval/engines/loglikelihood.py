"""Scoring requests (lm-eval's loglikelihood and multiple choice): the optional engine capability.

A `Request` with `logprob_pairs` asks, for each (context, continuation) of raw text, for the summed
log-probability of the continuation's tokens given the context and whether greedy decoding would emit
exactly those tokens. Engines that can answer implement `loglikelihood(requests)`; `send` routes each
request to `generate` or `loglikelihood` and refuses, before any work, on an engine without it.

Tokenisation follows lm-eval's `TemplateLM.loglikelihood` so the numbers are the ones lm-eval would get from
the same model: trailing whitespace of the context moves to the continuation, the pair is encoded whole
and split at the context's length, no special tokens are added, and an empty context is replaced by the
prefix token (BOS, else EOS).
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable, Iterator, Sequence

from fp8eval.engines.base import Choice, Completion, EngineError, Request, encode_loglikelihoods


def send(engine, requests: Sequence[Request]) -> Iterator[Completion]:
    """Generation requests to engine.generate, scoring requests to engine.loglikelihood."""
    scoring = [r for r in requests if r.logprob_pairs]
    generating = [r for r in requests if not r.logprob_pairs]
    if scoring and not engine.capabilities.loglikelihood:
        raise EngineError(
            f"engine {engine.kind!r} cannot score loglikelihood requests ({len(scoring)} of this task's requests "
            f"are loglikelihood / multiple-choice); run them with engine=reference, engine=vllm or engine=server, or "
            f"choose generate_until tasks only.")
    streams = []
    if generating:
        streams.append(engine.generate(generating))
    if scoring:
        streams.append(engine.loglikelihood(scoring))
    return itertools.chain(*streams)


def encode_pair(encode: Callable[[str], list[int]], context: str, continuation: str,
                prefix_token_id: int | None) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval encodes them; `encode` adds no special tokens."""
    if context == "":
        cont = encode(continuation)
        if prefix_token_id is None:
            raise EngineError("an empty-context loglikelihood request needs a BOS or EOS token; the tokenizer has none")
        if cont and cont[0] == prefix_token_id:
            return cont[:1], cont[1:]
        return [prefix_token_id], cont
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = encode(context + continuation)
    ctx = encode(context)
    return ctx, whole[len(ctx):]


def prefix_token_id(tok) -> int | None:
    """lm-eval's prefix token for an empty context: BOS when the tokenizer has one, else EOS."""
    return tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id


def completion(req: Request, pairs: list[tuple[float, bool]], prompt_tokens: int, latency_s: float = 0.0,
               cached_prompt_tokens: int | None = 0) -> Completion:
    """The Completion of a scoring request: n identical choices (scoring is deterministic)."""
    text = encode_loglikelihoods(pairs)
    return Completion(request_id=req.id, prompt_tokens=prompt_tokens, cached_prompt_tokens=cached_prompt_tokens,
                      latency_s=latency_s,
                      choices=[Choice(text=text, finish_reason="stop", output_tokens=0) for _ in range(req.n)])


def check_fits(req: Request, lengths: Iterable[int], max_len: int) -> None:
    """Refuse, never truncate: lm-eval would cut the context from the left, which changes the question."""
    longest = max(lengths, default=0)
    if longest > max_len:
        raise EngineError(f"request {req.id}: a context + continuation of {longest} tokens exceeds max_model_len "
                          f"{max_len} (the runner should have skipped it)")
