"""Is the Hugging Face hub reachable? Decided once per process, in at most ~1.5 s.

The offline variables (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE, HF_DATASETS_OFFLINE) are honoured first. When
the hub cannot be reached, `prepare_offline()` sets HF_HUB_OFFLINE=1 before the hub libraries are imported,
so a cached copy still loads at once and a missing one fails at once, instead of after a minute of retries.
"""

from __future__ import annotations

import os
import socket
import threading
from urllib.parse import urlparse

OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
TIMEOUT_S = 1.5
_STATE: dict[str, str | None] = {}


def offline_reason() -> str | None:
    """None when the hub looks reachable; else why not (an offline variable, or no connection)."""
    if "reason" in _STATE:
        return _STATE["reason"]
    reason = next((f"{v}={os.environ[v]}" for v in OFFLINE_VARS
                   if os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")), None)
    if reason is None:
        url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
        host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
        result: list[str | None] = []

        def probe() -> None:  # in a thread: name resolution has no timeout of its own
            try:
                socket.create_connection((host, port), timeout=TIMEOUT_S).close()
                result.append(None)
            except OSError as e:
                result.append(f"no connection to {host}:{port} ({type(e).__name__})")

        t = threading.Thread(target=probe, daemon=True)
        t.start()
        t.join(TIMEOUT_S + 0.2)
        reason = result[0] if result else f"no connection to {host}:{port} within {TIMEOUT_S} s"
    _STATE["reason"] = reason
    return reason


def known_offline_reason() -> str | None:
    """Why the hub is unreachable, if this process already found out (never probes)."""
    return _STATE.get("reason")


def prepare_offline() -> str | None:
    """Put the hub libraries in offline mode when the hub is unreachable; returns the reason (or None)."""
    reason = offline_reason()
    if reason is not None:
        for var in OFFLINE_VARS:
            os.environ.setdefault(var, "1")
    return reason

