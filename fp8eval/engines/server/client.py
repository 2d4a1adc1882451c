"""Sending one generation request to one OpenAI-compatible base URL, with retries and checked answers.

`Endpoint(root, model_id, api_key, ...)`, `endpoint.client()` (an `openai.AsyncOpenAI`,
fp8eval.engines.server.transport) and `await endpoint.send(client, request)` -> Completion are the unit a
replica pool builds on (one Endpoint and one client per URL). Requests go through the SDK's
`with_raw_response`: the SDK sends them (auth, headers, its retries); the body is checked here, as bytes,
before any of it becomes a record.

What happens to each outcome:
- connection errors, timeouts (the per-read timeout and the overall deadline), HTTP 408/409/429 and 5xx:
  retried by the SDK (`engine.max_retries`, jittered exponential backoff, Retry-After honoured); when
  retries run out, `EngineError` (the server is down: stopping keeps every finished record; a rerun resumes);
- HTTP 400/413/422: this request alone is bad (e.g. too long): its sequences become error records;
- other 4xx (401, 403, 404): `EngineError` at once (every request would fail the same way);
- 200 whose body is not JSON, not an answer, short of the `n` choices asked, larger than the request's
  bound (`transport.answer_limit`) or with impossible `usage` numbers: retried here; on the last attempt
  the good choices are kept and the missing ones become error records (retried on the next run);
- 200 for another model than preflight checked: `WrongModel`, the run stops.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import openai

import fp8eval.engines.server.transport as transport
from fp8eval.core.secrets import redact
from fp8eval.engines.base import Completion, EngineError, Request
from fp8eval.engines.server.answers import BadAnswer, error_completion, parse_answer

_CHAT_KEYS = ("temperature", "top_p", "max_tokens", "stop", "presence_penalty", "frequency_penalty")
_EXTRA_KEYS = ("top_k", "min_p", "repetition_penalty")
_RETRY_STATUS = {408, 409, 425, 429}
REQUEST_ERROR_STATUS = {400, 413, 422}  # this request alone is bad
# Body keys the SDK's create() takes as named arguments; the rest travel in extra_body.
_SDK_KEYS = {"model", "messages", "prompt", "n", "seed", *_CHAT_KEYS}


def request_body(req: Request, model_id: str, token_ids: bool) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of a generation request: chat unless the request carries plain prompt text."""
    sampling = {k: v for k, v in (req.sampling or {}).items() if v is not None}
    body: dict[str, Any] = {"model": model_id, "n": req.n}
    body.update({k: sampling[k] for k in _CHAT_KEYS if k in sampling})
    body.update({k: sampling[k] for k in _EXTRA_KEYS if k in sampling})
    if req.seeds:
        body["seed"] = int(req.seeds[0])  # vLLM seeds the n children seed, seed+1, ...
    if token_ids:
        body["return_token_ids"] = True  # exact per-choice output token counts when n > 1
    if req.prompt_text is not None:
        body["prompt"] = req.prompt_text
        return "/v1/completions", body
    body["messages"] = list(req.messages)
    if req.chat_template_kwargs:
        body["chat_template_kwargs"] = dict(req.chat_template_kwargs)
    return "/v1/chat/completions", body


def _cause(exc: BaseException) -> str:
    inner = exc.__cause__ or exc.__context__ or exc
    return f"{type(inner).__name__}: {redact(str(inner) or type(exc).__name__)}"


@dataclass
class Endpoint:
    """One OpenAI-compatible server: where it is, which model it must answer as, how hard to retry."""

    root: str  # http://host:port (no /v1)
    model_id: str
    api_key: str = "EMPTY"
    max_retries: int = 5
    backoff_s: float = 1.0
    backoff_cap_s: float = 30.0
    token_ids: bool = False  # ask vLLM for return_token_ids
    request_timeout_s: float = 3600.0  # overall deadline of one attempt (the read timeout too)
    concurrency: int = 8
    organization: str | None = None
    default_headers: dict[str, str] = field(default_factory=dict)
    max_model_len: int | None = None  # bounds answers of requests without max_tokens

    def headers(self) -> dict[str, str]:
        """The HTTP headers of every request as the SDK sends them (bearer key, organization, defaults)."""
        return transport.sdk_headers(self.api_key, self.organization, self.default_headers)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry `attempt`: exponential from backoff_s, capped at backoff_cap_s, with 50-100%
        jitter."""
        return transport.backoff(attempt, self.backoff_s, self.backoff_cap_s)

    def client(self, sdk_retries: int | None = None):
        """An `openai.AsyncOpenAI` for this server (close with `await client.close()`); its own retries
        are `sdk_retries` (default max_retries; the replica pool passes 0 and retries across replicas)."""
        return transport.make_async_client(
            self.root, self.api_key, deadline_s=self.request_timeout_s,
            max_retries=self.max_retries if sdk_retries is None else sdk_retries, concurrency=self.concurrency,
            organization=self.organization, default_headers=self.default_headers, backoff_s=self.backoff_s,
            backoff_cap_s=self.backoff_cap_s)

    async def attempt(self, client, req: Request) -> Completion:
        """One try at `req` (with the SDK's own retries of transport errors and 5xx): its Completion, or
        `Unreachable`, `HTTPStatusError`, `BadAnswer` (with the usable part of the answer in `.partial`
        when there is one) or `WrongModel`."""
        path, body = request_body(req, self.model_id, self.token_ids)
        chat = path.endswith("chat/completions")
        named = {k: v for k, v in body.items() if k in _SDK_KEYS}
        extra = {k: v for k, v in body.items() if k not in _SDK_KEYS}
        max_tokens = body.get("max_tokens")
        token = transport.ANSWER_LIMIT.set(transport.answer_limit(req.n, max_tokens, self.max_model_len))
        started = time.monotonic()
        try:
            api = client.chat.completions if chat else client.completions
            raw = await api.with_raw_response.create(**named, extra_body=extra or None)
            content = raw.http_response.content
        except openai.APIStatusError as exc:
            raise HTTPStatusError(exc.status_code, redact(exc.response.text[:300])) from None
        except openai.APIConnectionError as exc:  # refused, reset, read timeout, overall deadline
            raise Unreachable(_cause(exc)) from None
        except transport.AnswerTooLarge as exc:
            bad = BadAnswer(str(exc))
            bad.partial = None
            raise bad from None
        except openai.OpenAIError as exc:  # anything else the SDK raises on the way: no answer
            raise Unreachable(f"{type(exc).__name__}: {redact(exc)}") from None
        finally:
            transport.ANSWER_LIMIT.reset(token)
        try:
            parsed = json.loads(content)
        except ValueError as exc:
            raise BadAnswer(f"malformed body ({exc}): {redact(content[:120])!r}") from None
        latency = time.monotonic() - started
        limits = {"max_tokens": max_tokens, "max_model_len": self.max_model_len}
        try:
            return parse_answer(req, parsed, self.model_id, latency, chat=chat, limits=limits)
        except BadAnswer as exc:
            try:
                exc.partial = parse_answer(req, parsed, self.model_id, latency, chat=chat, final=True, limits=limits)
            except BadAnswer:
                exc.partial = None
            raise

    async def send(self, client, req: Request) -> Completion:
        """One request, retried as the module docstring says; never returns fewer than req.n choices. The
        client's SDK has retried transport errors and 5xx already; this loop retries unusable answers."""
        for attempt in range(self.max_retries + 1):
            final = attempt == self.max_retries
            try:
                return await self.attempt(client, req)
            except Unreachable as exc:
                last = str(exc)
            except BadAnswer as exc:
                if final:  # the server is up but its answers are not: errors, retried on the next run
                    return final_answer(req, exc, attempt + 1)
                await asyncio.sleep(self.backoff(attempt))
                continue
            except HTTPStatusError as exc:
                if exc.status_code in REQUEST_ERROR_STATUS:
                    return error_completion(req, f"HTTP {exc.status_code}: {exc.text}")
                if not retryable_status(exc.status_code):
                    raise EngineError(
                        f"The server refused request {req.id} with HTTP {exc.status_code} ({exc.text}); "
                        "stopping (this would fail every request). Records so far are kept.") from None
                last = f"HTTP {exc.status_code}: {exc.text[:200]}"
            raise EngineError(
                f"Request {req.id} failed {self.max_retries + 1} times against {redact(self.root)} (last: {last}). "
                "Stopping; every completed record is kept, so rerunning the same command resumes where "
                "this run stopped.")
        raise AssertionError("unreachable")


class Unreachable(Exception):
    """No answer at all: connection refused or reset, timeout."""


class HTTPStatusError(Exception):
    """An HTTP status other than 200 (`text`: the start of the body, redacted)."""

    def __init__(self, status_code: int, text: str):
        super().__init__(f"HTTP {status_code}: {text}")
        self.status_code = status_code
        self.text = text


def retryable_status(status: int) -> bool:
    """5xx, 429 and the other transient statuses: worth asking again."""
    return status >= 500 or status in _RETRY_STATUS


def final_answer(req: Request, exc: BadAnswer, attempts: int) -> Completion:
    """After the last attempt: the usable choices of the last answer, errors for the rest."""
    partial = getattr(exc, "partial", None)
    return partial if partial is not None else error_completion(
        req, f"unusable answer after {attempts} attempts: {exc}")


def short_error(exc: BaseException) -> str:
    """An exception's message, redacted and cut to 300 characters (for one-line error texts)."""
    return redact(str(getattr(exc, "message", None) or exc))[:300]
