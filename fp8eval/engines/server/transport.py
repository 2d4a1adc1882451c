"""The HTTP layer under `engine=server`: the official `openai` SDK (`AsyncOpenAI`) over an httpx client whose
transport bounds every request in time and size.

- **Deadline**: one attempt (connect, headers and the whole body) must finish within
  `engine.request_timeout_s`, whatever the pace: a server that trickles one byte a second never trips a
  per-read timeout, so the transport wraps the attempt in an overall deadline and reports a miss as
  `httpx.ReadTimeout` (the SDK then retries it like any timeout). The read timeout stays next to it.
- **Size**: the body is read here, chunk by chunk, and refused with `AnswerTooLarge` as soon as it passes
  the bound of the request in flight (`answer_limit`, derived from max_tokens and n; set per request
  through `ANSWER_LIMIT`). `AnswerTooLarge` is an `openai.OpenAIError`, which the SDK hands back as it is,
  without retrying (asking again would transfer the same flood).
- Compression is declined (`Accept-Encoding: identity`), so the bytes counted are the bytes parsed.

`make_async_client` builds the `AsyncOpenAI` (api_key, organization, default_headers as SDK users set
them; its own retries with our backoff); `make_sync_client` the plain httpx client of the preflight,
/tokenize, /metrics and the lm-eval scoring requests, with the same deadline and a fixed size bound.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import time
from typing import Any

import httpx
import openai

# Bytes one generated token may take in a JSON answer: UTF-8 text escaped as \\uXXXX (up to 6 bytes per
# character, a few characters per token) plus its token id when return_token_ids is on.
BYTES_PER_TOKEN = 64
# Room for the envelope (ids, usage, finish reasons, reasoning field names) of any answer.
ENVELOPE_BYTES = 64 * 1024
# When a request names no max_tokens: what the model's context allows, else this.
UNBOUNDED_ANSWER_BYTES = 64 * 1024 * 1024
# Preflight, /tokenize, /metrics and scoring answers (token-id lists and logprobs of long prompts).
SYNC_ANSWER_BYTES = 256 * 1024 * 1024

ANSWER_LIMIT: contextvars.ContextVar[int | None] = contextvars.ContextVar("fp8eval_answer_limit", default=None)


class AnswerTooLarge(openai.OpenAIError):
    """A body larger than the bound of the request it answers (not retried by the SDK)."""


def answer_limit(n: int, max_tokens: int | None, max_model_len: int | None = None) -> int:
    """The largest answer (bytes) a generation request of `n` sequences of up to `max_tokens` tokens can
    honestly need; without max_tokens, the model's context bounds it."""
    tokens = max_tokens if max_tokens else max_model_len
    if not tokens:
        return UNBOUNDED_ANSWER_BYTES
    return ENVELOPE_BYTES + max(1, int(n)) * int(tokens) * BYTES_PER_TOKEN


def check_timeout(value: Any, name: str = "engine.request_timeout_s") -> float:
    """`value` as a positive, finite number of seconds, else ValueError naming the option."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not a number of seconds") from None
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{name}={value!r}: a request needs a deadline above 0 s (e.g. 600)")
    return seconds


async def _read_bounded(response: httpx.Response, limit: int | None) -> bytes:
    body = bytearray()
    try:
        async for chunk in response.aiter_raw():
            body += chunk
            if limit is not None and len(body) > limit:
                raise AnswerTooLarge(f"the answer passed {limit:,} bytes, the bound for this request (from "
                                     "max_tokens and n); refused")
    finally:
        await response.aclose()
    return bytes(body)


class DeadlineTransport(httpx.AsyncBaseTransport):
    """An async transport that reads each answer whole, within `deadline_s` and `ANSWER_LIMIT` bytes."""

    def __init__(self, deadline_s: float, inner: httpx.AsyncBaseTransport | None = None, **kw: Any):
        self.deadline_s = deadline_s
        self.inner = inner or httpx.AsyncHTTPTransport(**kw)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request`; the answer with its body read, or ReadTimeout past the deadline / AnswerTooLarge."""
        limit = ANSWER_LIMIT.get()
        try:
            async with asyncio.timeout(self.deadline_s):
                response = await self.inner.handle_async_request(request)
                content = await _read_bounded(response, limit)
        except TimeoutError:
            raise httpx.ReadTimeout(f"no complete answer within the {self.deadline_s:g} s deadline "
                                    "(engine.request_timeout_s)", request=request) from None
        return httpx.Response(response.status_code, headers=response.headers, content=content,
                              extensions=response.extensions, request=request)

    async def aclose(self) -> None:
        """Close the connections."""
        await self.inner.aclose()


class SyncDeadlineTransport(httpx.BaseTransport):
    """The synchronous twin: the deadline is checked between chunks (so it holds within one read timeout)."""

    def __init__(self, deadline_s: float, limit: int = SYNC_ANSWER_BYTES, **kw: Any):
        self.deadline_s = deadline_s
        self.limit = limit
        self.inner = httpx.HTTPTransport(**kw)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request`; the answer with its body read, or ReadTimeout / AnswerTooLarge."""
        end = time.monotonic() + self.deadline_s
        response = self.inner.handle_request(request)
        body = bytearray()
        try:
            for chunk in response.iter_raw():
                body += chunk
                if len(body) > self.limit:
                    raise AnswerTooLarge(f"the answer to {request.url.path} passed {self.limit:,} bytes; refused")
                if time.monotonic() > end:
                    raise httpx.ReadTimeout(f"no complete answer within the {self.deadline_s:g} s deadline "
                                            "(engine.request_timeout_s)", request=request)
        finally:
            response.close()
        return httpx.Response(response.status_code, headers=response.headers, content=bytes(body),
                              extensions=response.extensions, request=request)

    def close(self) -> None:
        """Close the connections."""
        self.inner.close()


def _timeout(deadline_s: float) -> httpx.Timeout:
    return httpx.Timeout(deadline_s, connect=min(30.0, deadline_s))


class _Client(openai.AsyncOpenAI):
    """AsyncOpenAI whose retry waits follow `engine` backoff (tests shrink it); Retry-After is honoured."""

    backoff_s = 1.0
    backoff_cap_s = 30.0

    def _calculate_retry_timeout(self, remaining_retries, options, response_headers=None) -> float:
        after = self._parse_retry_after_header(response_headers)
        if after is not None and 0 < after <= self.backoff_cap_s:
            return after
        attempt = max(0, options.get_max_retries(self.max_retries) - remaining_retries)
        return backoff(attempt, self.backoff_s, self.backoff_cap_s)


def backoff(attempt: int, base_s: float, cap_s: float) -> float:
    """Seconds before retry `attempt`: exponential from base_s, capped at cap_s, with 50-100 % jitter."""
    return min(cap_s, base_s * 2 ** attempt) * (0.5 + random.random() / 2)


def make_async_client(root: str, api_key: str, *, deadline_s: float, max_retries: int, concurrency: int,
                      organization: str | None = None, default_headers: dict[str, str] | None = None,
                      backoff_s: float = 1.0, backoff_cap_s: float = 30.0) -> openai.AsyncOpenAI:
    """An `AsyncOpenAI` for `root`/v1 over a DeadlineTransport (close with `await client.close()`)."""
    http = httpx.AsyncClient(
        transport=DeadlineTransport(deadline_s, limits=httpx.Limits(max_connections=concurrency,
                                                                    max_keepalive_connections=concurrency)),
        timeout=_timeout(deadline_s), headers={"Accept-Encoding": "identity"})
    client = _Client(base_url=root.rstrip("/") + "/v1", api_key=api_key, organization=organization,
                     default_headers=dict(default_headers or {}), max_retries=max_retries,
                     timeout=_timeout(deadline_s), http_client=http)
    client.backoff_s, client.backoff_cap_s = backoff_s, backoff_cap_s
    return client


def sdk_headers(api_key: str, organization: str | None, default_headers: dict[str, str] | None) -> dict[str, str]:
    """The headers the SDK itself sends (bearer key, organization and project, also from OPENAI_ORG_ID /
    OPENAI_PROJECT_ID, default_headers, its User-Agent), for the plain requests it has no method for
    (/tokenize, /metrics, /version, scoring): asked of an `openai.OpenAI` client, so they cannot drift."""
    client = openai.OpenAI(api_key=api_key, organization=organization, base_url="http://127.0.0.1/v1",
                           default_headers=dict(default_headers or {}), http_client=httpx.Client())
    try:
        defaults = {k: v for k, v in client.default_headers.items() if isinstance(v, str) and k != "Content-Type"}
        return {**client.auth_headers, **defaults}
    finally:
        client.close()


def make_sync_client(deadline_s: float, headers: dict[str, str]) -> httpx.Client:
    """The httpx client of preflight, /tokenize, /metrics and scoring: same deadline, bounded answers."""
    return httpx.Client(transport=SyncDeadlineTransport(deadline_s), timeout=_timeout(deadline_s),
                        headers={"Accept-Encoding": "identity", **headers})
