"""Consume an asyncio producer from ordinary (synchronous) code: the server engine and the replica pool
send requests with asyncio, while the runner iterates over completions."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Awaitable, Callable, Iterator


def iterate(produce: Callable[[queue.Queue, threading.Event], Awaitable[None]], name: str) -> Iterator:
    """Run `produce(out, stop)` on an event loop in a daemon thread and yield every item it puts as
    ("completion", item). Its exception is re-raised here; when the consumer stops early (or raises),
    `stop` is set so the producer winds down."""
    out: queue.Queue = queue.Queue()
    stop = threading.Event()

    def run() -> None:
        try:
            asyncio.run(produce(out, stop))
        except BaseException as exc:  # noqa: BLE001 - handed to the consuming thread
            out.put(("error", exc))
        finally:
            out.put(("end", None))

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        while True:
            kind, item = out.get()
            if kind == "completion":
                yield item
            elif kind == "error":
                raise item
            else:
                return
    finally:
        stop.set()
        thread.join(timeout=30)
