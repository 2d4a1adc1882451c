"""The values that cross rooms: what a task asks (Sample, Prompt), what an engine is sent and returns
(Request, Choice, Completion) and what a scorer says (Score). Plain dataclasses, no behaviour beyond
hashing a prompt."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sample:
    id: str
    data: dict[str, Any]  # whatever the task needs to build the prompt and to score
    groups: tuple[str, ...] = ()  # labels this sample's score is also reported under, e.g. ("ctx=4k",)


@dataclass(frozen=True)
class Prompt:
    messages: tuple[dict, ...]
    # For models without a chat template the engine renders messages as plain text itself; a task
    # sets prompt_text only when it needs a specific raw prompt.
    prompt_text: str | None = None
    # A scoring prompt (lm-eval's loglikelihood / multiple choice): (context, continuation) pairs whose
    # log-probabilities the engine returns instead of generating (Request.logprob_pairs).
    logprob_pairs: tuple[tuple[str, str], ...] = ()
    # Sampling this prompt needs (e.g. an lm-eval task's `until` stops and max_gen_toks): over the model's and
    # the task config's sampling, under the user's top-level sampling overrides (Runner.prompt_sampling).
    sampling: dict[str, Any] | None = None

    def hash(self) -> str:
        body: dict[str, Any] = {"messages": list(self.messages), "prompt_text": self.prompt_text}
        # Only when set, so the hashes (and records) of every existing prompt stay what they were.
        if self.logprob_pairs:
            body["logprob_pairs"] = [list(p) for p in self.logprob_pairs]
        if self.sampling:
            body["sampling"] = self.sampling
        payload = json.dumps(body, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()


@dataclass
class Score:
    value: float  # in [0, 1]; pass@1 is its mean
    extracted: str | None = None  # what was pulled out of the completion, for flip lists and debugging
    details: dict[str, Any] = field(default_factory=dict)


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
    output_tokens: int | None  # None: the engine gave no per-sequence count (a server with only a total)
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
