"""Kept-alive managed servers (`engine.keep_alive=true`, `python -m fp8eval.up`; issue 34): the warm path.

A managed `vllm serve` started with keep_alive is detached from the run (its own session, no parent-death signal)
and written into a registry, one JSON file per server under `<cache>/servers/`, keyed by everything that decides
what the server computes: the Python that runs vLLM, the engine args, the arm's environment and extra flags (not
the launch-only memory settings). A later run whose arm has the same key attaches to it after /health answers,
instead of starting one: no vLLM start-up at all. Its fingerprint is the managed server's as if started anew (the
same engine args), so its records are shared with a run that started the server itself. `python -m fp8eval.up
down` stops every registered server; a registered server that died is forgotten when next looked up.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from fp8eval.core.paths import cache_root


def registry_dir() -> Path:
    return cache_root() / "servers"


def key_of(python: str, args: dict[str, Any], env: dict[str, str], extra_flags: list[str],
           served_model_name: str | None) -> str:
    """What a server computes depends on, hashed: the registry's key."""
    material = {"python": python, "args": args, "env": env, "extra_flags": [str(f) for f in extra_flags],
                "served_model_name": served_model_name}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:20]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: alive, not ours to use
        return True
    try:  # a zombie (our own child that exited) counts as gone
        return Path(f"/proc/{int(pid)}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return True


def lookup(key: str) -> dict | None:
    """The registered server of this key if its process is alive, else None (a dead one is forgotten)."""
    path = registry_dir() / f"{key}.json"
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not pid_alive(entry.get("pid", -1)):
        path.unlink(missing_ok=True)
        return None
    return entry


def start_detached(cmd: list[str], log_path: Path, env: dict[str, str]) -> int:
    """Start a server that outlives this run: its own session and process group, its output to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                start_new_session=True, close_fds=True)
    return proc.pid


def register(key: str, url: str, pid: int, log_path: Path, arm: str, args: dict[str, Any],
             settings: dict[str, Any]) -> dict:
    entry = {"key": key, "url": url, "pid": int(pid), "log": str(log_path), "arm": arm, "args": args,
             "launch_settings": settings, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    registry_dir().mkdir(parents=True, exist_ok=True)
    tmp = registry_dir() / f".{key}.json.tmp"
    tmp.write_text(json.dumps(entry, indent=1, default=str))
    tmp.replace(registry_dir() / f"{key}.json")
    return entry


def forget(key: str) -> None:
    (registry_dir() / f"{key}.json").unlink(missing_ok=True)


def stop(entry: dict, grace_s: float = 20.0) -> bool:
    """Stop one registered server's process group (SIGTERM, then SIGKILL) and forget it; whether it was running."""
    pid = int(entry.get("pid", -1))
    running = pid_alive(pid)
    if running:
        try:
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    forget(entry["key"])
    return running


def entries() -> list[dict]:
    """Every registered server still alive (dead ones forgotten)."""
    out = []
    for path in sorted(registry_dir().glob("*.json")):
        got = lookup(path.stem)
        if got is not None:
            out.append(got)
    return out
