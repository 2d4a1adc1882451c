"""Checking an OpenAI-compatible answer before any of it becomes a record.

A 200 answer is trusted only when it is a JSON object for the model we asked, with exactly the `n`
choices we asked for (indices 0..n-1, each once, each an object with text) and `usage` numbers that can be
true (`check_usage`: whole numbers, never negative, completion tokens within n x max_tokens, prompt tokens
within the model's context, cached prompt tokens within the prompt). Anything else is a
`BadAnswer` (retried by the client; recorded as errors when retries run out) or, for another model's
answer, `WrongModel` (the run stops: every further answer would be another model's too).
"""

from __future__ import annotations

from typing import Any

from fp8eval.engines.base import Choice, Completion, EngineError, Request


class BadAnswer(Exception):
    """A 200 answer that cannot be used as it is (malformed, short); worth asking again."""


class WrongModel(EngineError):
    """The server answered for another model than the one the arm was checked against at preflight."""


def _reasoning(msg: dict) -> str | None:
    return msg.get("reasoning_content") or msg.get("reasoning") or None


_MAX_COUNT = 2 ** 31  # no usage number above this is believed, whatever the model


def _count(value: Any, what: str, bound: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadAnswer(f"usage.{what} is {value!r}, not a whole number")
    top = min(bound, _MAX_COUNT) if bound else _MAX_COUNT
    if not 0 <= value <= top:
        raise BadAnswer(f"usage.{what}={value} is impossible (must lie in [0, {top}])")
    return value


def check_usage(usage: Any, n: int, limits: dict | None) -> dict | None:
    """The answer's `usage` object with every number checked (BadAnswer when one cannot be true); None
    when the server sent none. `limits`: {max_tokens, max_model_len} of the request (None: unknown)."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise BadAnswer(f"usage is a JSON {type(usage).__name__}, not an object")
    limits = limits or {}
    per_seq = limits.get("max_tokens") or limits.get("max_model_len")
    prompt = _count(usage.get("prompt_tokens"), "prompt_tokens", limits.get("max_model_len"))
    _count(usage.get("completion_tokens"), "completion_tokens", n * per_seq if per_seq else None)
    _count(usage.get("total_tokens"), "total_tokens", None)
    details = usage.get("prompt_tokens_details")
    if details is not None and not isinstance(details, dict):
        raise BadAnswer(f"usage.prompt_tokens_details is a JSON {type(details).__name__}, not an object")
    if details:
        _count(details.get("cached_tokens"), "prompt_tokens_details.cached_tokens",
               prompt if prompt is not None else limits.get("max_model_len"))
        if prompt == 0 and details.get("cached_tokens"):
            raise BadAnswer("usage says more cached prompt tokens than prompt tokens")
    return usage


def _choice(raw: Any, chat: bool, n_total: int, usage: dict | None, max_tokens: int | None = None) -> Choice:
    if not isinstance(raw, dict):
        raise BadAnswer(f"a choice is {type(raw).__name__}, not an object")
    if chat:
        msg = raw.get("message")
        if not isinstance(msg, dict):
            raise BadAnswer(f"choice {raw.get('index')} has no message object")
        text, reasoning = msg.get("content"), _reasoning(msg)
        if text is None and reasoning is None:
            raise BadAnswer(f"choice {raw.get('index')} has neither content nor reasoning")
        text = text or ""
    else:
        text, reasoning = raw.get("text"), None
        if not isinstance(text, str):
            raise BadAnswer(f"choice {raw.get('index')} has no text")
    if not isinstance(text, str):
        raise BadAnswer(f"choice {raw.get('index')} content is {type(text).__name__}, not text")
    token_ids = raw.get("token_ids")
    if isinstance(token_ids, list):
        n_out = len(token_ids)
        if max_tokens and n_out > max_tokens:
            raise BadAnswer(f"choice {raw.get('index')} has {n_out} token ids for max_tokens={max_tokens}")
    elif usage is not None and n_total == 1:
        n_out = int(usage.get("completion_tokens") or 0)
    else:
        n_out = None  # unknown per choice: the server gave only a total
    reason, error = raw.get("finish_reason"), None
    if reason in ("stop", "length"):
        finish = reason
    elif reason in (None, "eos", "stop_sequence", "tool_calls"):
        finish = "stop"
    else:  # "abort", "error", ...: not an answer to score
        finish, error = "error", f"server finish_reason={reason}"
    return Choice(text=text, finish_reason=finish, output_tokens=n_out, reasoning=reasoning, error=error)


def parse_answer(req: Request, body: Any, model_id: str, latency_s: float, chat: bool,
                 final: bool = False, limits: dict | None = None) -> Completion:
    """The Completion of a 200 answer `body` (parsed JSON) to `req`, or BadAnswer / WrongModel.

    `final` (the last attempt): choices that are missing or malformed come back as error choices and the
    good ones are kept, so a sequence is never silently lost and never guessed. Impossible `usage` numbers
    (`check_usage` against `limits`) make the whole answer unusable, final or not."""
    if not isinstance(body, dict):
        raise BadAnswer(f"the answer is a JSON {type(body).__name__}, not an object")
    got_model = body.get("model")
    if got_model is not None and got_model != model_id:
        raise WrongModel(f"The server answered request {req.id} as model {got_model!r}, but preflight checked "
                         f"{model_id!r}: another model is behind this URL now. Stopping; records so far are "
                         "kept and name the model they came from.")
    raw_choices = body.get("choices")
    if not isinstance(raw_choices, list):
        raise BadAnswer("the answer has no choices list")
    usage = check_usage(body.get("usage"), req.n, limits)
    max_tokens = (limits or {}).get("max_tokens")
    by_index: dict[int, Choice] = {}
    problems: list[str] = []
    for pos, raw in enumerate(raw_choices):
        index = raw.get("index", pos) if isinstance(raw, dict) else pos
        if not isinstance(index, int) or not 0 <= index < req.n or index in by_index:
            problems.append(f"choice index {index!r} is not one of the {req.n} asked for, or repeats")
            continue
        try:
            by_index[index] = _choice(raw, chat, req.n, usage, max_tokens)
        except BadAnswer as e:
            problems.append(str(e))
    missing = [i for i in range(req.n) if i not in by_index]
    if missing:
        problems.append(f"{len(missing)} of {req.n} sequences missing (indices {missing[:8]})")
    if problems and not final:
        raise BadAnswer("; ".join(problems))
    why = "; ".join(problems)
    choices = [by_index.get(i) or Choice(text="", finish_reason="error", output_tokens=0,
                                         error=f"not in the server's answer after retries: {why}")
               for i in range(req.n)]
    prompt_tokens = int((usage or {}).get("prompt_tokens") or 0)
    details = (usage or {}).get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Completion(
        request_id=req.id, choices=choices, prompt_tokens=prompt_tokens, cached_prompt_tokens=cached,
        latency_s=round(latency_s, 4),
        extra={"computed_prompt_tokens": prompt_tokens - cached if cached is not None else None,
               "completion_tokens_total": (usage or {}).get("completion_tokens")},
    )


def error_completion(req: Request, message: str) -> Completion:
    """Every sequence of `req` as an error choice (recorded as status "error", retried on the next run)."""
    return Completion(request_id=req.id, prompt_tokens=0, choices=[
        Choice(text="", finish_reason="error", output_tokens=0, error=message) for _ in range(req.n)])
