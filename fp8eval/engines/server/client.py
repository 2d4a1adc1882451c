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

from fp8eval.engines.base import Completion, EngineError, Request
from fp8eval.engines.server.answers import BadAnswer, error_completion, parse_answer
from fp8eval.secrets import redact

_CHAT_KEYS = ("temperature", "top_p", "max_tokens", "stop", "presence_penalty", "frequency_penalty")
_EXTRA_KEYS = ("top_k", "min_p", "repetition_penalty")
_RETRY_STATUS = {408, 409, 425, 429}
_REQUEST_ERROR_STATUS = {400, 413, 422}


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
        return {"Authorization": f"Bearer {self.api_key}"}

    def backoff(self, attempt: int) -> float:
        return min(self.backoff_cap_s, self.backoff_s * 2 ** attempt) * (0.5 + random.random() / 2)

    async def send(self, http, req: Request) -> Completion:
        """One request, retried as the module docstring says; never returns fewer than req.n choices."""
        import httpx

        path, body = request_body(req, self.model_id, self.token_ids)
        last, answer_failed = "", False
        for attempt in range(self.max_retries + 1):
            final = attempt == self.max_retries
            started = time.monotonic()
            try:
                r = await http.post(self.root + path, json=body, headers=self.headers())
            except httpx.HTTPError as exc:
                last, answer_failed = f"{type(exc).__name__}: {redact(str(exc))}", False
            else:
                answer_failed = r.status_code == 200
                if r.status_code == 200:
                    try:
                        parsed = json.loads(r.content)
                    except ValueError as exc:
                        last = f"malformed body ({exc}): {r.text[:120]!r}"
                    else:
                        try:
                            return parse_answer(req, parsed, self.model_id, time.monotonic() - started,
                                                chat=path.endswith("chat/completions"), final=final)
                        except BadAnswer as exc:
                            last = f"bad answer: {exc}"
                elif r.status_code in _REQUEST_ERROR_STATUS:
                    return error_completion(req, f"HTTP {r.status_code}: {redact(r.text[:300])}")
                elif r.status_code >= 500 or r.status_code in _RETRY_STATUS:
                    last = f"HTTP {r.status_code}: {redact(r.text[:200])}"
                else:
                    raise EngineError(
                        f"The server refused request {req.id} with HTTP {r.status_code} ({redact(r.text[:300])}); "
                        "stopping (this would fail every request). Records so far are kept.")
            if not final:
                await asyncio.sleep(self.backoff(attempt))
        if answer_failed:  # the server is up but its answers are unusable: errors, retried on the next run
            return error_completion(req, f"unusable answer after {self.max_retries + 1} attempts: {last}")
        raise EngineError(
            f"Request {req.id} failed {self.max_retries + 1} times against {redact(self.root)} (last: {last}). "
            "Stopping; every completed record is kept, so rerunning the same command resumes where "
            "this run stopped.")
