"""Child processes die with their parent, whatever kills the parent (Linux: PR_SET_PDEATHSIG).

The kernel sends the signal when the parent *thread* that forked the child exits, so children are forked
from the main thread (the scoring pool forks on the runner's thread; vLLM children in engines/vllm/child).
"""

from __future__ import annotations

import os
import signal

PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGKILL, parent_pid: int | None = None) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies; if the parent `parent_pid` is
    already gone (it died before this call), exit now. False where the call is not available."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        ok = False
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the parent died between fork and prctl: nobody will read our results
    return ok


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def scoring_worker_init(parent_pid: int) -> None:
    """Initializer of scoring pool workers: die with the runner; leave Ctrl-C to the runner (it shuts
    the pool down), so one interrupt prints one line, not a traceback per worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_parent_death_signal(signal.SIGKILL, parent_pid)
