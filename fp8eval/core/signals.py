"""SIGTERM behaves like SIGINT: `exit_on_sigterm()` makes it raise `Terminated` (a KeyboardInterrupt) in the
main thread, so the CLIs' one-line interrupt handling, their `finally` blocks (claims released, engines
closed, appends committed) and their records all behave the same; `interrupt_exit_code` gives 130 for
SIGINT and 143 (128 + SIGTERM) for SIGTERM, as shells expect."""

from __future__ import annotations

import signal
import threading


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when the process receives SIGTERM."""


def _raise(signum, frame) -> None:
    raise Terminated()


def exit_on_sigterm() -> None:
    """Turn SIGTERM into `Terminated` in the main thread (a no-op outside it)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise)


def interrupt_exit_code(exc: BaseException) -> int:
    """130 for Ctrl-C (SIGINT), 143 for SIGTERM."""
    return 143 if isinstance(exc, Terminated) else 130
