"""Where a run's wall time goes: inside the engine or in the harness around it.

The runner charges every call into an engine (start-up, each wait for the next completion, close) to
`EngineClock`; whatever else the run spends (planning, token counting, records, scoring, fsync, claims,
summary) is the harness's. `summary.json["timing"]` reports both. For an engine that works in another
process while the harness handles a completion (vLLM offline, server), the harness figure is an upper
bound: part of it overlaps the engine's work.
"""

from __future__ import annotations

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

    def add(self, part: str, seconds: float) -> None:
        """Charge `seconds` of engine time to `part`."""
        self.parts[part] = self.parts.get(part, 0.0) + seconds

    @contextmanager
    def engine(self, part: str):
        """Time the enclosed block as engine time under `part`."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(part, time.perf_counter() - t)

    @contextmanager
    def harness(self, part: str):
        """Time the enclosed block as a named part of the harness's time (shown, not subtracted)."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.harness_parts[part] = self.harness_parts.get(part, 0.0) + time.perf_counter() - t

    def stream(self, items: Iterable[T], part: str = "generate") -> Iterator[T]:
        """Iterate `items` (an engine's completions), charging each wait for the next one to `part`."""
        it = iter(items)
        while True:
            t = time.perf_counter()
            try:
                x = next(it)
            except StopIteration:
                self.add(part, time.perf_counter() - t)
                return
            self.add(part, time.perf_counter() - t)
            yield x

    def report(self) -> dict:
        """{wall_s, engine_s, harness_s, harness_share (harness / engine), harness_share_of_wall, cpu_s,
        engine_parts, harness_parts}; seconds rounded to 4 digits."""
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
            "engine_parts": {k: round(v, 4) for k, v in sorted(self.parts.items())},
            "harness_parts": {k: round(v, 4) for k, v in sorted(self.harness_parts.items())},
        }
