"""Run untrusted model-written Python programs against tests, contained.

Public: `run_tests(code, tests, testtype, func_name=None, timeout_s=6.0) -> list[bool]` and
`run_tests_detailed(...)` (one `Verdict` per test, with the reason). Comparison follows the official
LiveCodeBench runner: stdin programs are compared line by line after stripping whitespace (a line that
differs as text may still match as a list of decimals); functional programs call
`Solution().<func_name>(*args)` (or the module-level function when the code has no `class Solution`) with
one JSON value per input line and compare the result with `==`. Where fp8eval differs from the official
runner on purpose (a fresh process per test, real stdin and stdout) and why no published number moves:
docs/sandbox.md.

Isolation, one fresh process per test (all layers are tried; `isolation()` says which one took):
- A new session / process group (start_new_session); on timeout or completion the whole group is
  SIGKILLed. CPU-time (RLIMIT_CPU), address-space (RLIMIT_AS), file-size (RLIMIT_FSIZE, which is also the
  output cap since stdout and stderr go to files), open files, core dumps off; wall-clock kill.
- When the harness runs as root (CI does), each concurrent slot drops to its own unused uid
  (from `ROOT_UID_BASE`, claimed machine-wide with an flock per uid, so two harness processes on one machine
  never share one: `harness.claim_uid`). That is what stops a fork bomb for root: RLIMIT_NPROC is not enforced for
  uid 0 but is for the dropped uid, and it is per slot so one bomb cannot starve another test. The
  dropped uid cannot signal the harness, cannot read root's home (0700) or /proc/<harness>/environ, and
  cannot delete root's files. After every run each process still owned by the slot uid is SIGKILLed, so a
  program that setsid()s a daemon out of its process group is reaped too.
- When not root, a user namespace is created (so RLIMIT_NPROC counts only this run's processes).
- Namespaces, when the kernel allows them: a network namespace (no interfaces but a down loopback: no
  network at all), a PID namespace (the program is pid 1 of its own namespace: kill(-1) or killing the
  "parent" reaches nothing outside, and every leftover process dies with it), and a mount namespace
  with private tmpfs on /tmp, /var/tmp and /dev/shm (the working directory lives there), tmpfs over the
  harness user's home (the Python installation is bind-mounted back if it lives there) and a fresh /proc.
- No network namespace (e.g. Docker's default seccomp profile forbids unshare): the fallback is an
  in-process audit hook installed before user code runs that refuses socket creation, connect, bind and
  name resolution. It is weaker (ctypes or an external program gets around it); `isolation()` reports it.
- A minimal environment (PATH, LANG, HOME set to the work dir; nothing of the harness's), `python -I`.

Modules: `harness` (processes, slots, uids, verdicts), `child` (the bootstrap the harness runs as
`python -I child.py <json>`: limits, namespaces, privileges, then the program; standard library only),
`compare` (the official comparisons).
"""

from fp8eval.scoring.sandbox.compare import Verdict, compare_functional, compare_stdout
from fp8eval.scoring.sandbox.harness import (
                                             DEFAULT_MEMORY_MB,
                                             DEFAULT_OUTPUT_LIMIT_BYTES,
                                             DEFAULT_TIMEOUT_S,
                                             PRELUDE,
                                             isolation,
                                             run_tests,
                                             run_tests_detailed,
)

__all__ = ["Verdict", "compare_functional", "compare_stdout", "DEFAULT_MEMORY_MB", "DEFAULT_OUTPUT_LIMIT_BYTES",
           "DEFAULT_TIMEOUT_S", "PRELUDE", "isolation", "run_tests", "run_tests_detailed"]
