"""Where a run's wall time goes: inside the engine or in the harness around it.

The runner charges every call into an engine (start-up, each wait for the next completion, close) to
`EngineClock`; whatever else the run spends (planning, token counting, records, scoring, fsync, claims,
summary) is the harness's. `summary.json["timing"]` reports both. For an engine that works in another
process while the harness handles a completion (vLLM offline, server), the harness figure is an upper
bound: part of it overlaps the engine's work.

Harness work may also run while an engine call is in flight in another thread: planning in a thread while
the first engine starts (fp8eval.token_counts.EarlyPlan), the summary while the last engine closes in the
background (`background`). `harness_s` (wall minus engine time) leaves that work out; it is reported on its
own as `harness_overlapped_s` (the time named harness parts ran while an engine call was in flight), and
`harness_work_s = harness_s + harness_overlapped_s` is all the harness did.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


class EngineClock:
    """Seconds spent inside engine calls, by part (start, generate, close, ...), against the run's wall."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.cpu0 = time.process_time()
        self.parts: dict[str, float] = {}
        self.harness_parts: dict[str, float] = {}
        self._engine_spans: list[tuple[float, float]] = []  # (start, end) of every engine call
        self._harness_spans: list[tuple[float, float]] = []  # (start, end) of named harness parts
        self._pending: list[Background] = []  # background engine calls not yet joined

    def add(self, part: str, seconds: float, start: float | None = None) -> None:
        """Charge `seconds` of engine time to `part` (from `start`, a perf_counter reading, when known)."""
        self.parts[part] = self.parts.get(part, 0.0) + seconds
        if start is not None:
            self._engine_spans.append((start, start + seconds))

    @contextmanager
    def engine(self, part: str):
        """Time the enclosed block as engine time under `part`."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(part, time.perf_counter() - t, t)

    @contextmanager
    def harness(self, part: str):
        """Time the enclosed block as a named part of the harness's time (shown, not subtracted)."""
        t = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            self.harness_parts[part] = self.harness_parts.get(part, 0.0) + end - t
            self._harness_spans.append((t, end))

    def background(self, part: str, fn, *args) -> "Background":
        """Run `fn(*args)` in a thread as engine time under `part`; `.join()` (or `settle()`) waits for it and
        re-raises its error."""
        call = Background(self, part, fn, args)
        self._pending.append(call)
        return call

    def settle(self) -> None:
        """Wait for every background engine call not yet joined; raise the first error after all are done."""
        pending, self._pending = self._pending, []
        errors = []
        for call in pending:
            try:
                call.join()
            except BaseException as e:  # noqa: BLE001 - the others are waited for first
                errors.append(e)
        if errors:
            raise errors[0]

    def overlapped(self) -> float:
        """Seconds during which a named harness part ran while an engine call was in flight (in another thread:
        a thread's harness parts never nest in its own engine calls)."""
        harness, engine = _union(self._harness_spans), _union(self._engine_spans)
        total, j = 0.0, 0
        for h0, h1 in harness:
            while j < len(engine) and engine[j][1] <= h0:
                j += 1
            k = j
            while k < len(engine) and engine[k][0] < h1:
                total += min(h1, engine[k][1]) - max(h0, engine[k][0])
                k += 1
        return total

    def stream(self, items: Iterable[T], part: str = "generate") -> Iterator[T]:
        """Iterate `items` (an engine's completions), charging each wait for the next one to `part`."""
        it = iter(items)
        while True:
            t = time.perf_counter()
            try:
                x = next(it)
            except StopIteration:
                self.add(part, time.perf_counter() - t, t)
                return
            self.add(part, time.perf_counter() - t, t)
            yield x

    def report(self) -> dict:
        """{wall_s, engine_s, harness_s, harness_share (harness / engine), harness_share_of_wall, cpu_s,
        harness_overlapped_s, harness_work_s, harness_work_share (work / engine), engine_parts, harness_parts};
        seconds rounded to 4 digits."""
        wall = time.perf_counter() - self.t0
        engine = sum(self.parts.values())
        harness = max(0.0, wall - engine)
        return {
            "wall_s": round(wall, 4),
            "engine_s": round(engine, 4),
            "harness_s": round(harness, 4),
            "harness_share": round(harness / engine, 6) if engine > 0 else None,
            "harness_share_of_wall": round(harness / wall, 6) if wall > 0 else None,
            "cpu_s": round(time.process_time() - self.cpu0, 4),
            "harness_overlapped_s": round(self.overlapped(), 4),
            "harness_work_s": round(harness + self.overlapped(), 4),
            "harness_work_share": round((harness + self.overlapped()) / engine, 6) if engine > 0 else None,
            "engine_parts": {k: round(v, 4) for k, v in sorted(self.parts.items())},
            "harness_parts": {k: round(v, 4) for k, v in sorted(self.harness_parts.items())},
        }


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering `spans`."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class Background:
    """An engine call running in a thread (EngineClock.background); its span counts as engine time."""

    def __init__(self, clock: EngineClock, part: str, fn, args: tuple):
        self.error: BaseException | None = None

        def body() -> None:
            t = time.perf_counter()
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to join()
                self.error = e
            finally:
                clock.add(part, time.perf_counter() - t, t)

        self.thread = threading.Thread(target=body, name=f"engine-{part}", daemon=True)
        self.thread.start()

    def join(self) -> None:
        """Wait for the call; raise what it raised."""
        self.thread.join()
        if self.error is not None:
            raise self.error
