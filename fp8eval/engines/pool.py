"""`engine=server` with several URLs for one arm: a pool of replicas of the same server.

`engine.base_urls.fp8=[http://gpu1:8000,http://gpu2:8000]` (a single string still means one server).
Every replica passes the single-server preflight (`fp8eval.engines.server`), and then they must agree
with each other on everything that can change a number: vLLM version, served model, max_model_len and
the cache config (effective KV dtype, skip layers, block size, prefix caching...). If one differs, the
arm refuses to start and names it. The pool's describe() is the replicas' common one, so the arm
fingerprint does not depend on how many replicas served it (one URL or five resume the same records).

Requests go to the least-loaded live replica (fewest in flight, `engine.concurrency` each). A replica
whose connection fails and whose /health no longer answers is dropped; its in-flight requests go back to
the queue and are sent elsewhere, so every request is answered exactly once. 5xx, timeouts and unusable
answers on a live replica are retried with backoff, up to `engine.max_retries` per request, on another
replica than the one that just failed (when there is one). A replica that fails `engine.eject_after`
requests in a row while its /health still answers (e.g. it cuts every answer mid-body) is ejected: no
request goes to it again in this run, and the run completes on the others. The last live replica is
never ejected (its failures then stop the run through the retry budget). Drops and ejections are counted
in summary.json (`replica_pool`) and named in `engine_warnings`. Each replica's `AsyncOpenAI` client runs
without SDK retries (`sdk_retries=0`): the pool retries, so a retry can change replica.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from typing import Any

from fp8eval.config import RunConfig
from fp8eval.core.secrets import redact
from fp8eval.engines import async_bridge
from fp8eval.engines.base import Completion, EngineBase, EngineError, Request
from fp8eval.engines.server import ServerEngine
from fp8eval.engines.server.answers import BadAnswer
from fp8eval.engines.server.client import (
    REQUEST_ERROR_STATUS,
    HTTPStatusError,
    Unreachable,
    final_answer,
    retryable_status,
)
from fp8eval.engines.server.client import short_error as _short
from fp8eval.engines.spec import ArmSpec
from fp8eval.engines.vllm import args as vargs
from fp8eval.engines.vllm import stats as vstats

# Preflight fields every replica must share (cache_config is compared label by label).
IDENTITY_KEYS = ("server_version", "served_model", "model_root", "max_model_len", "attention_backend")


def arm_urls(cfg: RunConfig, kv: ArmSpec) -> list[str]:
    """The URLs of an arm's external server(s): `engine.base_urls[kv]` (a string or a list), else
    `engine.base_url`; empty for a managed server."""
    e = cfg.engine
    value = (e.base_urls or {}).get(kv.name) or e.base_url
    if not value:
        return []
    if isinstance(value, str):
        return [value]
    urls = [str(u) for u in value]
    if len(set(urls)) != len(urls):
        dup = sorted(u for u, c in Counter(urls).items() if c > 1)
        raise EngineError(f"engine.base_urls.{kv.name} lists {dup} more than once; a replica counts once.")
    return urls


def one_url_cfg(cfg: RunConfig, kv: ArmSpec, url: str):
    """The run config with this arm pointed at exactly one URL (what ServerEngine expects)."""
    urls = dict(cfg.engine.base_urls or {})
    urls[kv.name] = url
    return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, base_url=url, base_urls=urls))


def build_server_engine(cfg: RunConfig, kv: ArmSpec, shared: dict | None = None):
    """ServerEngine for a managed server or one URL, PoolEngine for several."""
    urls = arm_urls(cfg, kv)
    if not urls:
        return ServerEngine(cfg, kv, shared)
    if len(urls) == 1:
        return ServerEngine(one_url_cfg(cfg, kv, urls[0]), kv, shared)
    return PoolEngine(cfg, kv, urls, shared)


def identity(preflight: dict) -> dict[str, Any]:
    """What must be equal across replicas, flattened so a difference can be named label by label."""
    out = {k: preflight.get(k) for k in IDENTITY_KEYS}
    for label, value in sorted((preflight.get("cache_config") or {}).items()):
        out[f"cache_config.{label}"] = value
    out["kv_mismatch_trusted"] = preflight.get("kv_mismatch_trusted")
    return out


def odd_replicas(identities: list[dict]) -> list[tuple[int, list[str]]]:
    """[(replica index, ["key: its value vs the others' value"])] for every replica that differs from
    the majority on some key; empty when all agree."""
    keys = sorted({k for ident in identities for k in ident})
    odd: dict[int, list[str]] = {}
    for key in keys:
        values = [repr(ident.get(key)) for ident in identities]
        common, count = Counter(values).most_common(1)[0]
        if count == len(values):
            continue
        for i, v in enumerate(values):
            if v != common or count * 2 <= len(values):  # no majority: every replica is named
                odd.setdefault(i, []).append(f"{key}: {v} vs {common}")
    return sorted(odd.items())


build_server_engine.capabilities = vargs.SERVER_CAPABILITIES  # type: ignore[attr-defined]  # what `server` can do
# Kept-alive managed servers start side by side (engine.keep_alive); a pool of URLs starts nothing.
build_server_engine.prestart = ServerEngine.prestart  # type: ignore[attr-defined]
build_server_engine.effective_engine_args = ServerEngine.effective_engine_args  # type: ignore[attr-defined]


@dataclasses.dataclass
class Replica:
    index: int
    url: str
    engine: ServerEngine
    alive: bool = True
    in_flight: int = 0
    answered: int = 0
    failures: int = 0  # requests failed in a row (reset by an answer)
    failed_total: int = 0
    ejected: bool = False


class PoolEngine(EngineBase):
    """Several external servers of one arm behind the Engine protocol (see the module docstring)."""

    kind = "server"
    capabilities = vargs.SERVER_CAPABILITIES

    def __init__(self, cfg: RunConfig, kv: ArmSpec, urls: list[str], shared: dict | None = None):
        self.cfg = cfg
        self.kv = kv
        self.concurrency = max(1, int(cfg.engine.concurrency))
        self.max_retries = max(0, int(cfg.engine.max_retries))
        self.eject_after = int(cfg.engine.eject_after)
        if self.eject_after < 1:
            raise EngineError(f"engine.eject_after={cfg.engine.eject_after}: a replica needs at least 1 failure "
                              "in a row before it is ejected (e.g. 3)")
        self.replicas: list[Replica] = []
        self.dropped: list[str] = []
        self._prefill: dict[str, float] | None = {}
        try:
            for i, url in enumerate(urls):
                try:
                    engine = ServerEngine(one_url_cfg(cfg, kv, url), kv, shared)
                except EngineError as exc:
                    raise EngineError(f"Replica {i} ({redact(url)}) of arm {kv.name} failed its preflight, so the "
                                      f"arm does not start: {exc}") from None
                self.replicas.append(Replica(i, url, engine))
            self._check_same()
        except BaseException:
            self.close()
            raise

    def _check_same(self) -> None:
        odd = odd_replicas([identity(r.engine.preflight) for r in self.replicas])
        if odd:
            lines = [f"replica {i} ({redact(self.replicas[i].url)}): " + "; ".join(diffs) for i, diffs in odd]
            raise EngineError(
                f"The replicas of arm {self.kv.name} do not all run the same thing, so their records could "
                "not be pooled: " + " | ".join(lines) + ". Restart the odd replica(s) with the same vLLM "
                "version, model and KV settings as the others, or leave them out of engine.base_urls.")

    # -- Engine protocol ---------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        # Identical for every replica (checked), and free of URLs and of the replica count.
        return self.replicas[0].engine.describe()

    def startup_warnings(self) -> dict[str, list[str]]:
        out = dict(self.replicas[0].engine.startup_warnings())
        if self.dropped:
            out["replica_dropped"] = list(self.dropped)
        return out

    def max_model_len(self) -> int:
        return self.replicas[0].engine.max_model_len()

    def _live(self) -> list[Replica]:
        live = [r for r in self.replicas if r.alive]
        if not live:
            raise EngineError(f"Every replica of arm {self.kv.name} is down ({'; '.join(self.dropped)}). "
                              "Records so far are kept; rerun the same command once a replica is back.")
        return live

    def _drop(self, rep: Replica, why: str) -> None:
        if rep.alive:
            rep.alive = False
            self.dropped.append(redact(f"replica {rep.index} ({rep.url}) dropped after {rep.answered} answers: {why}"))

    def _failed(self, rep: Replica, why: str) -> None:
        """Count a failed request against `rep`; eject it after eject_after in a row (never the last one)."""
        rep.failures += 1
        rep.failed_total += 1
        others = [r for r in self.replicas if r.alive and r is not rep]
        if rep.alive and rep.failures >= self.eject_after and others:
            rep.ejected = True
            self._drop(rep, f"ejected after {rep.failures} failed requests in a row while /health answered "
                            f"(last: {why})")

    def pool_stats(self) -> dict[str, Any]:
        """summary.json's `replica_pool`: replicas, how many were dropped (down) or ejected (failing), and
        per replica its answers and failed requests (no URLs: they may carry credentials)."""
        return {"replicas": len(self.replicas),
                "dropped": sum(1 for r in self.replicas if not r.alive and not r.ejected),
                "ejected": sum(1 for r in self.replicas if r.ejected),
                "per_replica": [{"index": r.index, "alive": r.alive, "ejected": r.ejected, "answered": r.answered,
                                 "failed_requests": r.failed_total} for r in self.replicas]}

    def count_prompt_tokens(self, request: Request) -> int:
        while True:
            rep = min(self._live(), key=lambda r: (r.in_flight, r.index))
            try:
                return rep.engine.count_prompt_tokens(request)
            except EngineError as exc:
                if rep.engine._healthy():
                    raise
                self._drop(rep, f"/tokenize failed and /health does not answer ({exc})")

    def prefill_stats(self) -> dict | None:
        """Prefill work of this arm, summed over the replicas' /metrics counters."""
        return vstats.prefill_stats(self._prefill)

    def _counters(self) -> dict[str, float] | None:
        total: dict[str, float] = {}
        for rep in self._live():
            c = rep.engine._counters()
            if c is None:
                return None
            for k, v in c.items():
                total[k] = total.get(k, 0.0) + v
        return total

    def loglikelihood(self, requests: Iterable[Request]) -> Iterator[Completion]:
        """Scoring requests on one live replica: the replicas agree on everything that can change a number,
        and a scoring request is one prefill, so spreading them buys little."""
        return self._live()[0].engine.loglikelihood(requests)

    def teacher_force(self, request: Request, forced_text: str, other_text: str) -> dict:
        """The anatomy of one flip on one live replica (they agree on everything that can change a number)."""
        return self._live()[0].engine.teacher_force(request, forced_text, other_text)

    def generate(self, requests: Iterable[Request]) -> Iterator[Completion]:
        # Counters only when no replica was dropped during the call: a dead replica's work is lost.
        before = self._counters() if self._prefill is not None else None
        n_dropped = len(self.dropped)
        finished = False
        try:
            reqs = list(requests)
            yield from async_bridge.iterate(lambda out, stop: self._dispatch(reqs, out, stop),
                                            "fp8eval-pool-dispatch")
            finished = True
        finally:
            after = self._counters() if finished and before is not None and len(self.dropped) == n_dropped \
                else None
            if before is None or after is None:
                self._prefill = None
            else:
                for key, value in after.items():
                    self._prefill[key] = self._prefill.get(key, 0.0) + value - before.get(key, 0.0)

    async def _dispatch(self, requests: list[Request], out: queue.Queue, stop: threading.Event) -> None:
        clients = {r.index: r.engine.async_client(sdk_retries=0) for r in self.replicas}
        # (request, attempt, index of the replica that failed it last: avoided while another is free)
        pending: deque[tuple[Request, int, int | None]] = deque((r, 0, None) for r in requests)
        tasks: dict[asyncio.Task, tuple[Replica, Request, int]] = {}
        waiting = [0]  # requests sleeping their backoff before going back into `pending`
        loop = asyncio.get_running_loop()

        def requeue_later(req: Request, attempt: int, delay: float, avoid: int | None) -> None:
            waiting[0] += 1

            def back() -> None:
                waiting[0] -= 1
                pending.appendleft((req, attempt, avoid))

            loop.call_later(delay, back)

        try:
            while (pending or tasks or waiting[0]) and not stop.is_set():
                live = self._live()
                # Backpressure: no new request while the runner has that many answers it has not written
                # (a crash then loses about what is in flight, not a backlog).
                while pending and out.qsize() < self.concurrency * max(1, len(live)):
                    free = [r for r in live if r.in_flight < self.concurrency]
                    if not free:
                        break
                    req, attempt, avoid = pending[0]
                    elsewhere = [r for r in free if r.index != avoid]
                    if not elsewhere and any(r.index != avoid for r in live):
                        break  # wait for another replica than the one that just failed this request
                    rep = min(elsewhere or free, key=lambda r: (r.in_flight, r.index))
                    pending.popleft()
                    rep.in_flight += 1
                    tasks[asyncio.create_task(rep.engine.call_once(clients[rep.index], req))] = (rep, req, attempt)
                if not tasks:
                    await asyncio.sleep(0.02)
                    continue
                done, _ = await asyncio.wait(set(tasks), timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    rep, req, attempt = tasks.pop(task)
                    rep.in_flight -= 1
                    exc = task.exception()
                    if exc is None:
                        rep.answered += 1
                        rep.failures = 0
                        out.put(("completion", task.result()))
                        continue
                    await self._handle_failure(rep, req, attempt, exc, out, requeue_later, pending)
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            for client in clients.values():
                await client.close()

    async def _handle_failure(self, rep: Replica, req: Request, attempt: int, exc: BaseException,
                              out: queue.Queue, requeue_later, pending: deque) -> None:
        # The outcomes of one checked attempt (fp8eval.engines.server.client.Endpoint.attempt).
        if isinstance(exc, Unreachable):  # refused, reset, cut mid-body, or past the deadline
            if not rep.alive or not await asyncio.to_thread(rep.engine._healthy):
                rep.failed_total += 1
                self._drop(rep, f"{_short(exc)}; /health does not answer")
                pending.appendleft((req, attempt, rep.index))  # not the request's fault: no attempt counted
                return
        elif isinstance(exc, HTTPStatusError) and exc.status_code in REQUEST_ERROR_STATUS:
            # This request alone is bad (e.g. too long for the server): an error record, the rest go on.
            out.put(("completion", rep.engine._error_completion(req, f"HTTP {exc.status_code}: {exc.text}")))
            return
        elif isinstance(exc, HTTPStatusError) and not retryable_status(exc.status_code):
            raise EngineError(
                f"Replica {rep.index} ({redact(rep.url)}) refused request {req.id} with HTTP {exc.status_code} "
                f"({exc.text}); stopping (this would fail every request). Records so far are kept.") from None
        elif not isinstance(exc, (HTTPStatusError, BadAnswer)):
            raise exc  # WrongModel and anything unexpected stop the run
        # A live replica failed this request (5xx, timeout, cut answer, unusable answer): counted against it.
        self._failed(rep, f"{type(exc).__name__}: {_short(exc)}")
        if attempt >= self.max_retries:
            if isinstance(exc, BadAnswer):  # malformed or short: kept as error records, never lost
                out.put(("completion", final_answer(req, exc, attempt + 1)))
                return
            raise EngineError(
                f"Request {req.id} failed {attempt + 1} times on the replicas of arm {self.kv.name} (last: "
                f"replica {rep.index} {redact(rep.url)}, {type(exc).__name__}: {_short(exc)}). Stopping; every "
                "completed record is kept, so rerunning the same command resumes where this run stopped.")
        requeue_later(req, attempt + 1, rep.engine._backoff(attempt), rep.index)

    def close(self) -> None:
        for rep in self.replicas:
            rep.engine.close()
