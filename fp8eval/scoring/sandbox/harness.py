"""The sandbox's harness side: one fresh child process per test (fp8eval/scoring/sandbox/child.py), in
waves bounded by the cores, each in its own slot (its own uid when root), then the verdict."""

from __future__ import annotations

import json
import os
import sys

import fp8eval.scoring.sandbox.child as child
from fp8eval.scoring.sandbox.compare import Verdict, compare_functional, compare_stdout

DEFAULT_TIMEOUT_S = 6.0  # the official LiveCodeBench per-test timeout
DEFAULT_MEMORY_MB = 4096
DEFAULT_OUTPUT_LIMIT_BYTES = 32 << 20
DEFAULT_NPROC = 64  # processes + threads per run (only enforceable for a non-root uid / user namespace)
# Interpreter start and prelude imports, on top of timeout_s, before the harness's own wall kill: the
# program's limit is the child's alarm (child._arm), which starts when the program does.
STARTUP_ALLOWANCE_S = 1.0
ROOT_UID_BASE = 61000  # slot uids when the harness is root (as isolate does with 60000+box)
ROOT_UID_SPAN = 1024  # uids ROOT_UID_BASE .. +SPAN-1, shared by every harness process of the machine
# Where the machine-wide uid claims live (a local directory every process of the machine sees).
UID_LOCK_DIRS = ("/run/lock", "/dev/shm")
# Tests set this False to exercise the fallback layers (uid drop, audit-hook socket block) that a
# container without CAP_SYS_ADMIN gets.
USE_NAMESPACES = True
PRELUDE = child.PRELUDE


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _uid_lock_dir() -> str:
    import tempfile

    env = os.environ.get("FP8EVAL_SANDBOX_UID_LOCKS")
    for d in ([env] if env else [*UID_LOCK_DIRS, tempfile.gettempdir()]):
        path = os.path.join(d, "fp8eval-sandbox-uids")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            return path
        except OSError:
            continue
    raise RuntimeError("no directory for the sandbox's machine-wide uid claims (set FP8EVAL_SANDBOX_UID_LOCKS)")


def claim_uid() -> tuple[int, int]:
    """(uid, fd): a slot uid no other process of this machine holds, claimed with an exclusive flock on
    `<lock dir>/<uid>.lock` (released by the kernel when this process exits, however it exits), so two
    harness processes never run programs under one uid (and never kill each other's)."""
    import fcntl

    d = _uid_lock_dir()
    for uid in range(ROOT_UID_BASE, ROOT_UID_BASE + ROOT_UID_SPAN):
        fd = os.open(os.path.join(d, f"{uid}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return uid, fd
    raise RuntimeError(f"all {ROOT_UID_SPAN} sandbox uids from {ROOT_UID_BASE} are held by other processes")


class _SlotPool:
    """Bounds concurrent sandboxed processes (by the cores) and gives each its own uid when root: a uid
    claimed machine-wide (`claim_uid`) on the slot's first use and held for the process's lifetime."""

    def __init__(self, size: int):
        import queue
        import threading

        self.size = size
        self._free: "queue.Queue[int]" = queue.Queue()
        self._uids: dict[int, tuple[int, int]] = {}
        self._lock = threading.Lock()
        for i in range(size):
            self._free.put(i)

    def acquire(self) -> int:
        """A free slot (blocks while every slot runs a program)."""
        return self._free.get()

    def release(self, slot: int) -> None:
        """Give a slot back (its uid stays claimed by this process)."""
        self._free.put(slot)

    def uid(self, slot: int) -> int:
        """The slot's uid, claimed machine-wide on first use."""
        with self._lock:
            if slot not in self._uids:
                self._uids[slot] = claim_uid()
            return self._uids[slot][0]


_POOL: _SlotPool | None = None


def _pool() -> _SlotPool:
    global _POOL
    if _POOL is None:
        _POOL = _SlotPool(_cores())
    return _POOL


def _python_locations() -> list[str]:
    import sysconfig

    paths = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            paths.add(p)
    return sorted(os.path.realpath(p) for p in paths)


def _homes() -> list[str]:
    homes = {os.path.expanduser("~"), "/root"}
    if os.environ.get("HOME"):
        homes.add(os.environ["HOME"])
    return sorted(os.path.realpath(h) for h in homes if h and h != "/")


def _live_proc_uid(pid: str) -> int | None:
    """Real uid of a live (non-zombie) process, None when gone or a zombie (a zombie cannot be killed,
    only reaped by its parent)."""
    uid = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:") and line.split()[1] == "Z":
                    return None
                if line.startswith("Uid:"):
                    uid = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return uid


def _kill_uid(uid: int) -> None:
    """SIGKILL every process whose real uid is the slot's, until none is left (escaped daemons)."""
    import time

    for _ in range(200):
        found = False
        for pid in os.listdir("/proc"):
            if pid.isdigit() and _live_proc_uid(pid) == uid:
                found = True
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, PermissionError):
                    pass
        if not found:
            return
        time.sleep(0.01)


def _remove_uid_files(uid: int) -> None:
    """Without a private /tmp, a dropped uid can only write to world-writable dirs: clean those."""
    import shutil

    for top in ("/tmp", "/var/tmp", "/dev/shm"):
        try:
            entries = os.listdir(top)
        except OSError:
            continue
        for name in entries:
            path = os.path.join(top, name)
            try:
                if os.lstat(path).st_uid != uid:
                    continue
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)
            except OSError:
                pass


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _run_one(code_path: str, test: dict, testtype: str, func_name: str | None, timeout_s: float,
             memory_mb: int, output_limit: int, slot: int) -> Verdict:
    import math
    import shutil
    import signal
    import subprocess
    import tempfile
    import time

    is_root = os.getuid() == 0
    uid = _pool().uid(slot) if is_root else None
    run_dir = tempfile.mkdtemp(prefix="fp8eval-sbx-")  # harness-only (0700): stdio files live here
    work = tempfile.mkdtemp(prefix="fp8eval-work-")  # used only when no private /tmp can be made
    paths = {k: os.path.join(run_dir, k) for k in ("stdin", "input", "stdout", "stderr", "result", "iso")}
    # The program's real stdin is empty, as in the official runner's worker process: the input reaches it
    # through the official stand-ins (child.OfficialStdin), read by the child from its own descriptor.
    with open(paths["stdin"], "w", encoding="utf-8"), open(paths["input"], "w", encoding="utf-8") as f:
        f.write(test["input"])
    cfg = {
        "code_path": code_path,
        "testtype": testtype,
        "func_name": func_name,
        "cpu_s": math.ceil(timeout_s) + 1,
        "timeout_s": timeout_s,
        "memory_bytes": memory_mb << 20,
        "output_limit": output_limit,
        "nproc": DEFAULT_NPROC,
        "uid": uid,
        "workdir": work,
        "hide": _homes(),
        "keep": _python_locations(),
        "namespaces": USE_NAMESPACES,
    }
    proc = None
    start = time.monotonic()
    timed_out = False
    try:
        with open(paths["stdin"], "rb") as fin, open(paths["stdout"], "wb") as fout, \
                open(paths["stderr"], "wb") as ferr, open(paths["result"], "wb") as fres, \
                open(paths["iso"], "wb") as fiso, open(paths["input"], "rb") as finput:
            cfg["result_fd"], cfg["iso_fd"], cfg["input_fd"] = fres.fileno(), fiso.fileno(), finput.fileno()
            proc = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(child.__file__), json.dumps(cfg)],
                stdin=fin, stdout=fout, stderr=ferr,
                pass_fds=(fres.fileno(), fiso.fileno(), finput.fileno()), start_new_session=True, close_fds=True,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                cwd="/",
            )
            try:
                proc.wait(timeout=timeout_s + STARTUP_ALLOWANCE_S)
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        wall = time.monotonic() - start
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if uid is not None:
                _kill_uid(uid)
            proc.wait()
            if uid is not None:
                _remove_uid_files(uid)
    try:
        verdict = _judge(paths, test, testtype, proc.returncode, timed_out, output_limit)
        verdict.wall_s = round(wall, 3)
        try:
            with open(paths["iso"], encoding="utf-8") as f:
                verdict.isolation = json.loads(f.read() or "{}")
        except (OSError, ValueError):
            pass
        return verdict
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


_SIGXCPU, _SIGALRM, _SIGXFSZ = 24, 14, 25


def _judge(paths: dict, test: dict, testtype: str, returncode: int | None, timed_out: bool,
           output_limit: int) -> Verdict:
    tail = _tail(paths["stderr"])
    if timed_out or returncode in (-_SIGXCPU, 128 + _SIGXCPU, -_SIGALRM, 128 + _SIGALRM):
        return Verdict(False, "timeout", exit_code=returncode, stderr_tail=tail)
    sizes = [os.path.getsize(paths[k]) for k in ("stdout", "stderr", "result")]
    if max(sizes) >= output_limit or returncode in (-_SIGXFSZ, 128 + _SIGXFSZ):
        return Verdict(False, "output_limit", exit_code=returncode, stderr_tail=tail)
    if returncode != 0:
        return Verdict(False, "runtime_error", exit_code=returncode, stderr_tail=tail)
    if testtype == "stdin":  # what the program printed through sys.stdout, as the official capture sees it
        with open(paths["result"], "rb") as f:
            ok = compare_stdout(f.read().decode("utf-8", "replace"), test["output"])
    else:
        with open(paths["result"], "rb") as f:
            ok = compare_functional(f.read().decode("utf-8", "replace"), test["output"])
    return Verdict(ok, "passed" if ok else "wrong_answer", exit_code=returncode, stderr_tail=tail)


def run_tests_detailed(code: str, tests: list[dict], testtype: str, func_name: str | None = None,
                       timeout_s: float = DEFAULT_TIMEOUT_S, *, memory_mb: int = DEFAULT_MEMORY_MB,
                       output_limit: int = DEFAULT_OUTPUT_LIMIT_BYTES, stop_on_failure: bool = False,
                       max_workers: int | None = None) -> list[Verdict]:
    """One Verdict per test, in order. Tests run in waves of up to `max_workers` (default: the cores,
    and never more than the global slot pool). With stop_on_failure, the waves after one that had a
    failure are not run (status "not_run", passed False): pass@1 needs every test, so that is enough."""
    import shutil
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    if testtype not in ("stdin", "functional"):
        raise ValueError(f"testtype must be 'stdin' or 'functional', got {testtype!r}")
    if testtype == "functional" and not func_name:
        raise ValueError("functional tests need func_name (the Solution method to call)")
    if not tests:
        return []
    pool = _pool()
    workers = max(1, min(max_workers or pool.size, pool.size, len(tests)))
    code_dir = tempfile.mkdtemp(prefix="fp8eval-code-")
    code_path = os.path.join(code_dir, "solution.py")
    with open(code_path, "w", encoding="utf-8") as f:
        f.write(code)

    def one(test: dict) -> Verdict:
        slot = pool.acquire()
        try:
            return _run_one(code_path, test, testtype, func_name, timeout_s, memory_mb, output_limit, slot)
        except Exception as exc:  # noqa: BLE001 - a harness fault must not look like a pass or kill the run
            return Verdict(False, "sandbox_error", stderr_tail=repr(exc))
        finally:
            pool.release(slot)

    verdicts: list[Verdict] = []
    try:
        with ThreadPoolExecutor(max_workers=workers) as ex:
            for start in range(0, len(tests), workers):
                wave = tests[start:start + workers]
                verdicts.extend(ex.map(one, wave))
                if stop_on_failure and not all(v.passed for v in verdicts):
                    verdicts.extend(Verdict(False, "not_run") for _ in tests[len(verdicts):])
                    break
    finally:
        shutil.rmtree(code_dir, ignore_errors=True)
    return verdicts


def run_tests(code: str, tests: list[dict], testtype: str, func_name: str | None = None,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> list[bool]:
    """True per test that the program passes. Never raises for anything the program does."""
    return [v.passed for v in run_tests_detailed(code, tests, testtype, func_name, timeout_s)]


def isolation() -> dict:
    """Which isolation layers this machine gives (runs one trivial program)."""
    (v,) = run_tests_detailed("print(1)", [{"input": "", "output": "1"}], "stdin", timeout_s=5.0)
    return dict(v.isolation, works=v.passed)
