"""Run untrusted model-written Python programs against tests, contained.

Public: `run_tests(code, tests, testtype, func_name=None, timeout_s=6.0) -> list[bool]` and
`run_tests_detailed(...)` (one `Verdict` per test, with the reason). Comparison follows the official
LiveCodeBench runner: stdin programs are compared line by line after stripping whitespace (a line that
differs as text may still match as a list of decimals); functional programs call
`Solution().<func_name>(*args)` with one JSON value per input line and compare the JSON-decoded result.

Isolation, one fresh process per test (all layers are tried; `isolation()` says which one took):
- A new session / process group (start_new_session); on timeout or completion the whole group is
  SIGKILLed. CPU-time (RLIMIT_CPU), address-space (RLIMIT_AS), file-size (RLIMIT_FSIZE, which is also the
  output cap since stdout and stderr go to files), open files, core dumps off; wall-clock kill.
- When the harness runs as root (CI does), each concurrent slot drops to its own unused uid
  (`ROOT_UID_BASE + slot`). That is what stops a fork bomb for root: RLIMIT_NPROC is not enforced for
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

This file is also the child bootstrap: the harness runs `python -I sandbox.py <json>`; the child sets
the limits, drops privileges, then runs the program. The child part uses the standard library only.
"""

from __future__ import annotations

import json
import os
import sys

DEFAULT_TIMEOUT_S = 6.0  # the official LiveCodeBench per-test timeout
DEFAULT_MEMORY_MB = 4096
DEFAULT_OUTPUT_LIMIT_BYTES = 32 << 20
DEFAULT_NPROC = 64  # processes + threads per run (only enforceable for a non-root uid / user namespace)
STARTUP_ALLOWANCE_S = 1.0  # interpreter start and prelude imports, on top of timeout_s for the wall kill
ROOT_UID_BASE = 61000  # slot uids when the harness is root (as isolate does with 60000+box)
TMPFS_SIZE = "256m"
# Tests set this False to exercise the fallback layers (uid drop, audit-hook socket block) that a
# container without CAP_SYS_ADMIN gets.
USE_NAMESPACES = True

# Star imports the official LiveCodeBench runner makes available to every solution (LeetCode stubs use
# List, Optional, ... without importing typing; AtCoder solutions often rely on gcd, deque, ...).
PRELUDE = """\
import sys, os, math, re, string, json, heapq, bisect, random, itertools, functools, operator, \
collections, statistics, copy, datetime, io
from string import *
from re import *
from datetime import *
from collections import *
from heapq import *
from bisect import *
from copy import *
from math import *
from random import *
from statistics import *
from itertools import *
from functools import *
from operator import *
from io import *
from sys import *
from json import *
from builtins import *
from typing import *
sys.setrecursionlimit(50000)
"""

# Imported before privileges are dropped: when the interpreter lives where the dropped uid cannot read
# (e.g. under /root) and no mount namespace can bind it back, these are all a program can import.
PRELOAD = (
    "sys os math re string json heapq bisect random itertools functools operator collections "
    "statistics copy datetime io typing fractions decimal array numbers textwrap time dataclasses enum "
    "struct threading queue cmath pprint unicodedata calendar hashlib types abc contextlib glob shutil "
    "signal socket subprocess pathlib tempfile traceback warnings weakref inspect uuid base64 zlib"
).split()

# Linux constants (no os.unshare before Python 3.12).
_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_PR_SET_PDEATHSIG = 1


# =====================================================================================================
# Child side (runs inside the sandbox; standard library only, fp8eval is not importable under -I)
# =====================================================================================================
def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _unshare(flags: int) -> bool:
    return _libc().unshare(flags) == 0


def _mount(source, target, fstype, flags, data=None) -> bool:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    return _libc().mount(enc(source), enc(target), enc(fstype), flags, enc(data)) == 0


def _write_file(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _enter_namespaces(is_root: bool) -> dict:
    """Try the full set, then network only, then nothing. Returns what took."""
    uid, gid = os.getuid(), os.getgid()
    user = 0 if is_root else _CLONE_NEWUSER
    for flags in (user | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWNS, user | _CLONE_NEWNET):
        if _unshare(flags):
            if user:
                # Identity map: the program keeps its own uid, but counts (RLIMIT_NPROC) are per namespace.
                _write_file("/proc/self/setgroups", "deny")
                _write_file("/proc/self/uid_map", f"{uid} {uid} 1")
                _write_file("/proc/self/gid_map", f"{gid} {gid} 1")
            return {
                "userns": bool(user),
                "netns": True,
                "pidns": bool(flags & _CLONE_NEWPID),
                "mountns": bool(flags & _CLONE_NEWNS),
            }
    return dict(_NO_NAMESPACES)


_NO_NAMESPACES = {"userns": False, "netns": False, "pidns": False, "mountns": False}


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _setup_mounts(cfg: dict) -> str | None:
    """Private /tmp (the work dir), /var/tmp, /dev/shm; tmpfs over the homes, Python put back; fresh
    /proc. Returns the work dir, or None when the private /tmp could not be made."""
    os.umask(0o022)
    if not _mount(None, "/", None, _MS_REC | _MS_PRIVATE):
        return None
    tmp_opts = f"size={TMPFS_SIZE},mode=1777"
    if not _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, tmp_opts):
        return None
    for extra in ("/var/tmp", "/dev/shm"):
        if os.path.isdir(extra):
            _mount("tmpfs", extra, "tmpfs", _MS_NOSUID | _MS_NODEV, tmp_opts)
    hides = [h for h in cfg["hide"] if os.path.isdir(h) and not _under("/tmp", h)]
    staged = []
    for i, keep in enumerate(cfg["keep"]):
        if os.path.isdir(keep) and any(_under(keep, h) for h in hides):
            stage = f"/tmp/.keep{i}"
            os.mkdir(stage)
            if _mount(keep, stage, None, _MS_BIND | _MS_REC):
                staged.append((keep, stage))
    for h in hides:
        _mount("tmpfs", h, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=755")
    for keep, stage in staged:
        os.makedirs(keep, mode=0o755, exist_ok=True)
        _mount(stage, keep, None, _MS_BIND | _MS_REC)
        _libc().umount2(stage.encode(), _MNT_DETACH)
        os.rmdir(stage)
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    work = "/tmp/work"
    os.mkdir(work, 0o700)
    return work


def _world_readable(path: str) -> bool:
    """Can any uid list `path` (every directory above it searchable by others)?"""
    import stat

    parts = os.path.realpath(path).split("/")
    for i in range(2, len(parts) + 1):
        mode = os.stat("/".join(parts[:i]) or "/").st_mode
        if not mode & stat.S_IXOTH:
            return False
    return bool(os.stat(path).st_mode & stat.S_IROTH)


def _set_limits(cfg: dict, nproc: bool) -> None:
    import resource

    cpu = int(cfg["cpu_s"])
    limits = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_AS: (cfg["memory_bytes"], cfg["memory_bytes"]),
        resource.RLIMIT_FSIZE: (cfg["output_limit"], cfg["output_limit"]),
        resource.RLIMIT_CORE: (0, 0),
        resource.RLIMIT_NOFILE: (256, 256),
    }
    if nproc:
        limits[resource.RLIMIT_NPROC] = (cfg["nproc"], cfg["nproc"])
    for res, val in limits.items():
        resource.setrlimit(res, val)


_BLOCKED_AUDIT_EVENTS = frozenset(
    {"socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo",
     "socket.gethostbyname", "socket.gethostbyaddr"}
)


def _block_sockets_in_process() -> None:
    # Fallback only (no network namespace). Audit hooks cannot be removed from Python code.
    def hook(event, args):
        if event in _BLOCKED_AUDIT_EVENTS:
            raise PermissionError("network access is disabled in the fp8eval sandbox")

    sys.addaudithook(hook)


def _run_program(cfg: dict, code: str) -> None:
    """Runs in the final, restricted process. Exits with the program's status."""
    source = PRELUDE + "\n" + code
    try:
        compiled = compile(source, "solution.py", "exec")
    except BaseException as exc:  # noqa: BLE001
        print(f"compile error: {exc!r}", file=sys.stderr)
        os._exit(3)
    if cfg["testtype"] == "stdin":
        namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        exec(compiled, namespace)  # exceptions propagate: traceback on stderr, exit status 1
        sys.stdout.flush()
        return
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    exec(compiled, namespace)
    args = [json.loads(line) for line in cfg["input"].split("\n")]
    result = getattr(namespace["Solution"](), cfg["func_name"])(*args)
    if isinstance(result, tuple):
        result = list(result)
    payload = json.dumps({"result": result}).encode()
    os.write(cfg["result_fd"], payload)


def _child_main(cfg: dict) -> None:
    with open(cfg["code_path"], encoding="utf-8") as f:
        code = f.read()
    is_root = os.getuid() == 0
    iso = _enter_namespaces(is_root) if cfg["namespaces"] else dict(_NO_NAMESPACES)
    if iso["pidns"]:
        # The next process is pid 1 of the new namespace; when it exits, the kernel kills the rest.
        pid = os.fork()
        if pid:
            _, status = os.waitpid(pid, 0)
            os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
        _libc().prctl(_PR_SET_PDEATHSIG, 9)
    work = _setup_mounts(cfg) if iso["mountns"] else None
    iso["private_tmp"] = work is not None
    work = work or cfg["workdir"]
    uid = cfg.get("uid")
    if is_root and uid is not None:
        os.chown(work, uid, uid)
        if not _world_readable(os.path.dirname(os.__file__)):
            for name in PRELOAD:
                __import__(name)
    _set_limits(cfg, nproc=not is_root and iso["userns"] or (is_root and uid is not None))
    if is_root and uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    iso["uid"] = os.getuid()
    os.chdir(work)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work})
    if not iso["netns"]:
        _block_sockets_in_process()
        iso["socket_block"] = "audit-hook"
    os.write(cfg["iso_fd"], json.dumps(iso).encode())
    os.close(cfg["iso_fd"])
    sys.stdout.reconfigure(encoding="utf-8", errors="replace")
    _run_program(cfg, code)


# =====================================================================================================
# Harness side
# =====================================================================================================
from dataclasses import dataclass, field  # noqa: E402


@dataclass
class Verdict:
    passed: bool
    status: str  # passed | wrong_answer | timeout | runtime_error | output_limit | not_run | sandbox_error
    wall_s: float = 0.0
    exit_code: int | None = None
    stderr_tail: str = ""
    isolation: dict = field(default_factory=dict)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _as_decimals(line: str):
    from decimal import Decimal, InvalidOperation

    try:
        return [Decimal(tok) for tok in line.split()]
    except (InvalidOperation, ValueError):
        return None


def compare_stdout(prediction: str, expected: str) -> bool:
    """Line-by-line after stripping; a differing line may still match as whitespace-separated decimals."""
    pred, gold = _lines(prediction), _lines(expected)
    if len(pred) != len(gold):
        return False
    for p, g in zip(pred, gold):
        if p == g:
            continue
        pd, gd = _as_decimals(p), _as_decimals(g)
        if pd is None or gd is None or pd != gd:
            return False
    return True


def compare_functional(result_json: str, expected: str) -> bool:
    try:
        got = json.loads(result_json)["result"]
        return got == json.loads(expected)
    except (ValueError, KeyError, TypeError):
        return False


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


class _SlotPool:
    """Bounds concurrent sandboxed processes (by the cores) and gives each its own uid when root."""

    def __init__(self, size: int):
        import queue

        self.size = size
        self._free: "queue.Queue[int]" = queue.Queue()
        for i in range(size):
            self._free.put(i)

    def acquire(self) -> int:
        return self._free.get()

    def release(self, slot: int) -> None:
        self._free.put(slot)


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
    uid = ROOT_UID_BASE + slot if is_root else None
    run_dir = tempfile.mkdtemp(prefix="fp8eval-sbx-")  # harness-only (0700): stdio files live here
    work = tempfile.mkdtemp(prefix="fp8eval-work-")  # used only when no private /tmp can be made
    paths = {k: os.path.join(run_dir, k) for k in ("stdin", "stdout", "stderr", "result", "iso")}
    with open(paths["stdin"], "w", encoding="utf-8") as f:
        f.write(test["input"] if testtype == "stdin" else "")
    cfg = {
        "code_path": code_path,
        "testtype": testtype,
        "func_name": func_name,
        "input": test["input"] if testtype == "functional" else "",
        "cpu_s": math.ceil(timeout_s) + 1,
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
                open(paths["iso"], "wb") as fiso:
            cfg["result_fd"], cfg["iso_fd"] = fres.fileno(), fiso.fileno()
            proc = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(__file__), json.dumps(cfg)],
                stdin=fin, stdout=fout, stderr=ferr,
                pass_fds=(fres.fileno(), fiso.fileno()), start_new_session=True, close_fds=True,
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


_SIGXCPU = 24


def _judge(paths: dict, test: dict, testtype: str, returncode: int | None, timed_out: bool,
           output_limit: int) -> Verdict:
    tail = _tail(paths["stderr"])
    if timed_out or returncode in (-_SIGXCPU, 128 + _SIGXCPU):
        return Verdict(False, "timeout", exit_code=returncode, stderr_tail=tail)
    sizes = [os.path.getsize(paths[k]) for k in ("stdout", "stderr", "result")]
    if max(sizes) >= output_limit:
        return Verdict(False, "output_limit", exit_code=returncode, stderr_tail=tail)
    if returncode != 0:
        return Verdict(False, "runtime_error", exit_code=returncode, stderr_tail=tail)
    if testtype == "stdin":
        with open(paths["stdout"], "rb") as f:
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


if __name__ == "__main__":
    _child_main(json.loads(sys.argv[1]))
