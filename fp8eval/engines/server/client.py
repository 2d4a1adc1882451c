"""Sending one generation request to one OpenAI-compatible base URL, with retries and checked answers.

`Endpoint(root, model_id, api_key, ...)` and `await endpoint.send(http, request)` -> Completion are the
unit a replica pool builds on (one Endpoint per URL, one shared or per-URL `httpx.AsyncClient`).

What happens to each outcome:
- connection errors, timeouts, HTTP 429 and 5xx: retried with jittered exponential backoff; when retries
  run out, `EngineError` (the server is down: stopping keeps every finished record; a rerun resumes);
- HTTP 400/413/422: this request alone is bad (e.g. too long): its sequences become error records;
- other 4xx (401, 403, 404): `EngineError` at once (every request would fail the same way);
- 200 whose body is not JSON, not an answer, or short of the `n` choices asked: retried; on the last
  attempt the good choices are kept and the missing ones become error records (retried on the next run);
- 200 for another model than preflight checked: `WrongModel`, the run stops.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any

from fp8eval.core.secrets import redact
from fp8eval.engines.base import Completion, EngineError, Request
from fp8eval.engines.server.answers import BadAnswer, error_completion, parse_answer

_CHAT_KEYS = ("temperature", "top_p", "max_tokens", "stop", "presence_penalty", "frequency_penalty")
_EXTRA_KEYS = ("top_k", "min_p", "repetition_penalty")
_RETRY_STATUS = {408, 409, 425, 429}
REQUEST_ERROR_STATUS = {400, 413, 422}  # this request alone is bad


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
        if "reasoning_effort" in req.chat_template_kwargs:
            # gpt-oss on `vllm serve` renders harmony itself and reads the request's top-level field, not the kwargs
            body["reasoning_effort"] = req.chat_template_kwargs["reasoning_effort"]
    return "/v1/chat/completions", body


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

    def headers(self) -> dict[str, str]:
        """The HTTP headers of every request (bearer API key)."""
        return {"Authorization": f"Bearer {self.api_key}"}

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry `attempt`: exponential from backoff_s, capped at backoff_cap_s, with 50-100%
        jitter."""
        return min(self.backoff_cap_s, self.backoff_s * 2 ** attempt) * (0.5 + random.random() / 2)

    async def attempt(self, http, req: Request) -> Completion:
        """One try at `req`: its Completion, or `Unreachable`, `HTTPStatusError`, `BadAnswer` (with the
        usable part of the answer in `.partial` when there is one) or `WrongModel`."""
        import httpx

        path, body = request_body(req, self.model_id, self.token_ids)
        started = time.monotonic()
        try:
            r = await http.post(self.root + path, json=body, headers=self.headers())
        except httpx.HTTPError as exc:
            raise Unreachable(f"{type(exc).__name__}: {redact(str(exc))}") from None
        if r.status_code != 200:
            raise HTTPStatusError(r.status_code, redact(r.text[:300]))
        try:
            parsed = json.loads(r.content)
        except ValueError as exc:
            raise BadAnswer(f"malformed body ({exc}): {r.text[:120]!r}") from None
        chat = path.endswith("chat/completions")
        latency = time.monotonic() - started
        try:
            return parse_answer(req, parsed, self.model_id, latency, chat=chat)
        except BadAnswer as exc:
            try:
                exc.partial = parse_answer(req, parsed, self.model_id, latency, chat=chat, final=True)
            except BadAnswer:
                exc.partial = None
            raise

    async def send(self, http, req: Request) -> Completion:
        """One request, retried as the module docstring says; never returns fewer than req.n choices."""
        last = ""
        for attempt in range(self.max_retries + 1):
            final = attempt == self.max_retries
            try:
                return await self.attempt(http, req)
            except Unreachable as exc:
                last = str(exc)
            except BadAnswer as exc:
                last = f"unusable answer: {exc}"
                if final:  # the server is up but its answers are not: errors, retried on the next run
                    return final_answer(req, exc, attempt + 1)
            except HTTPStatusError as exc:
                if exc.status_code in REQUEST_ERROR_STATUS:
                    return error_completion(req, f"HTTP {exc.status_code}: {exc.text}")
                if not retryable_status(exc.status_code):
                    raise EngineError(
                        f"The server refused request {req.id} with HTTP {exc.status_code} ({exc.text}); "
                        "stopping (this would fail every request). Records so far are kept.") from None
                last = f"HTTP {exc.status_code}: {exc.text[:200]}"
            if not final:
                await asyncio.sleep(self.backoff(attempt))
        raise EngineError(
            f"Request {req.id} failed {self.max_retries + 1} times against {redact(self.root)} (last: {last}). "
            "Stopping; every completed record is kept, so rerunning the same command resumes where "
            "this run stopped.")


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
