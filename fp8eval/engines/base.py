"""The engine protocol shared by every backend (fake, reference, vllm, server).

An engine receives `Request`s (one prompt, `n` samples, one seed per sample) and yields one
`Completion` per request as soon as it is done, in any order, so the runner can append records as
they arrive and a crash loses only the requests in flight.
"""

from __future__ import annotations

from fp8eval.errors import Fp8evalError

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Protocol, runtime_checkable


@dataclass(frozen=True)
class Request:
    id: str
    messages: tuple[dict, ...]  # chat messages [{"role": ..., "content": ...}]
    n: int  # samples drawn from this one prompt (the task's repeats): one prefill serves all
    seeds: tuple[int, ...]  # one seed per sample, len == n; engines that take one seed use seeds[0]
    sampling: dict  # temperature, top_p, top_k, min_p, max_tokens, stop (None = engine default)
    chat_template_kwargs: dict = field(default_factory=dict)
    # Set for models without a chat template: the raw text to complete, messages are then ignored.
    prompt_text: str | None = None
    # Non-empty: a scoring request, sent to the optional `engine.loglikelihood()` instead of `generate()`.
    # For each (context, continuation) of raw text the engine returns the summed log-probability of the
    # continuation's tokens given the context and whether greedy decoding would emit exactly them
    # (lm-eval's loglikelihood request); messages, prompt_text and sampling are then ignored.
    logprob_pairs: tuple[tuple[str, str], ...] = ()


@dataclass
class Choice:
    text: str  # the answer text, reasoning removed when the engine splits it out
    finish_reason: str  # "stop" | "length" | "error"
    output_tokens: int
    reasoning: str | None = None  # server-side reasoning_content, kept for the records
    error: str | None = None


@dataclass
class Completion:
    request_id: str
    choices: list[Choice]
    prompt_tokens: int
    cached_prompt_tokens: int | None = None  # prompt tokens served from a prefix cache, if known
    latency_s: float = 0.0
    extra: dict = field(default_factory=dict)


def encode_loglikelihoods(pairs: list[tuple[float, bool]]) -> str:
    """The text of a scoring request's Choice: JSON [[logprob, is_greedy], ...], one per logprob pair, so the
    records keep it as the completion and a task's pure score() reads it back (decode_loglikelihoods)."""
    return json.dumps([[float(lp), bool(g)] for lp, g in pairs])


def decode_loglikelihoods(text: str) -> list[tuple[float, bool]]:
    """The inverse of encode_loglikelihoods."""
    return [(float(lp), bool(g)) for lp, g in json.loads(text)]


class EngineError(Fp8evalError):
    """An engine could not be started or cannot serve the requested configuration.

    The message is shown to the user as is: one paragraph saying what, why, and what to do instead.
    """


@runtime_checkable
class Engine(Protocol):
    kind: str

    def describe(self) -> dict[str, Any]:
        """Everything about this engine that can change a number (goes into the arm fingerprint):
        engine kind and version, model id and revision, every engine arg, what preflight read back."""

    def max_model_len(self) -> int:
        """Largest prompt + output length in tokens this engine accepts."""

    def count_prompt_tokens(self, request: Request) -> int:
        """Tokens of the request's prompt exactly as the engine will see it (chat template applied)."""

    def generate(self, requests: Iterable[Request]) -> Iterator[Completion]:
        """Yield one Completion per request, as each finishes."""

    def close(self) -> None:
        """Release everything (processes, GPU memory). Safe to call twice."""

    # Optional (engines without it refuse scoring requests, see fp8eval.engines.loglikelihood):
    # def loglikelihood(self, requests: Iterable[Request]) -> Iterator[Completion]:
    #     """For requests with logprob_pairs: one Completion per request, n identical Choices whose text is
    #     encode_loglikelihoods([(logprob, is_greedy) per pair]), finish_reason "stop", output_tokens 0."""
