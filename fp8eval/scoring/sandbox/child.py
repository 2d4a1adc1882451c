"""The sandbox's child side: `python -I child.py <json>` sets the limits, enters the namespaces, drops
privileges, then runs the program (see fp8eval.scoring.sandbox for the layers). Standard library only:
fp8eval is not importable under -I."""

from __future__ import annotations

import io
import json
import os
import signal
import sys

TMPFS_SIZE = "256m"

# The official runner's prelude, the same statements in the same order (so `datetime` is the module, and
# `os` is not imported for the program): LeetCode stubs use List, Optional, ... without importing typing;
# AtCoder solutions often rely on gcd, deque, ...
PRELUDE = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\n"
    "from statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\n"
    "from io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\n"
    "import math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n"
)

# Imported before privileges are dropped: when the interpreter lives where the dropped uid cannot read
# (e.g. under /root) and no mount namespace can bind it back, these are all a program can import.
PRELOAD = (
    "ast unittest.mock faulthandler importlib sys os math re string json heapq bisect random itertools functools operator collections "
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
    # Python itself may live under /tmp (a checkout or venv there): hold those directories open and bind
    # them back into the private /tmp, so the program imports what the harness's Python has.
    under_tmp = [(k, os.open(k, os.O_RDONLY | os.O_DIRECTORY)) for k in cfg["keep"]
                 if os.path.isdir(k) and _under(k, "/tmp")]
    if not _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, tmp_opts):
        for _, fd in under_tmp:
            os.close(fd)
        return None
    for keep, fd in under_tmp:
        os.makedirs(keep, mode=0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", keep, None, _MS_BIND | _MS_REC)
        os.close(fd)
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


def _arm(seconds: float) -> None:
    """The official runner's per-test limit: signal.alarm, i.e. wall time of the program itself (not of
    interpreter start-up). The handler ends the process with status 128 + SIGALRM, which the harness
    judges a timeout (a handler, because the program may be pid 1 of its namespace, which ignores a
    signal's default action)."""
    signal.signal(signal.SIGALRM, _timed_out)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _timed_out(signum, frame) -> None:
    os._exit(128 + signal.SIGALRM)


def _run_program(cfg: dict, code: str) -> None:
    """Runs in the final, restricted process, as the official runner runs a program: a stdin program is
    rewritten into a function and called with the official stdin stand-ins and stdout capture; a functional
    one is executed as a module and its method called. Exits with the program's status."""
    inputs = cfg["input"]
    sys.set_int_max_str_digits(50000)  # set by the official runner's process (compute_code_generation_metrics)
    if cfg["testtype"] == "stdin":
        _run_stdin(cfg, code, inputs)
        return
    try:
        compiled = compile(PRELUDE + "\n\n" + code, "solution.py", "exec")
    except BaseException as exc:  # noqa: BLE001
        print(f"compile error: {exc!r}", file=sys.stderr)
        os._exit(3)
    namespace = {"__name__": "tmp_sol", "__builtins__": __builtins__}  # the official module's name
    _guard()
    _arm(float(cfg["timeout_s"]))  # the official runner gives the module's own top-level code one limit...
    exec(compiled, namespace)
    _arm(0)
    # ...looks the method up on Solution() when the text has "class Solution", else on the module...
    target = namespace["Solution"]() if "class Solution" in code else None
    method = getattr(target, cfg["func_name"]) if target is not None else namespace[cfg["func_name"]]
    args = [json.loads(line) for line in inputs.split("\n")]
    _arm(float(cfg["timeout_s"]))  # ...and each call another
    result = method(*args)
    _arm(0)
    if isinstance(result, tuple):  # as the official runner: a top-level tuple counts as a list
        result = list(result)
    os.write(cfg["result_fd"], json.dumps({"result": encode_result(result)}).encode())


def as_function(code: str) -> str:
    """The official stdin rewrite: a final `if __name__ == '__main__':` block is inlined, top-level imports stay
    at module level after the prelude, everything else becomes the body of `wrapped_function()`. Code that does
    not parse is left as it is (it then has no wrapped_function and fails, as officially)."""
    import ast

    try:
        tree = ast.parse(code)
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            code = ast.unparse(tree.body[:-1]) + "\n" + ast.unparse(last.body)
    except Exception:  # noqa: BLE001 - as officially: leave it
        pass
    try:
        tree = ast.parse(code)
        imports = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
        body = [s for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))]
        fn = ast.FunctionDef(name="wrapped_function", args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                             kw_defaults=[], defaults=[]), body=body, decorator_list=[], lineno=-1)
        return PRELUDE + "\n" + ast.unparse(imports) + "\n" + ast.unparse(fn)
    except Exception:  # noqa: BLE001
        return code


class OfficialStdin:
    """The official runner's sys.stdin stand-in: read() is the whole input, readline() reads on, readlines()
    is the input split at newlines (no line endings), buffer.read() the bytes, buffer.readline() always the
    first line; it cannot be iterated (`for line in sys.stdin` fails there, so it fails here)."""

    def __init__(self, inputs: str):
        self._inputs = inputs
        self._io = io.StringIO(inputs)
        self.buffer = _OfficialBuffer(inputs)

    def read(self, *args):
        """The whole input, every time (as the official runner's stand-in)."""
        return self._inputs

    def readline(self, *args):
        """The next line of the input."""
        return self._io.readline(*args)

    def readlines(self, *args):
        """The input split at newlines, without line endings (as the official runner's stand-in)."""
        return self._inputs.split("\n")

    def __getattr__(self, name):
        return getattr(self._io, name)


class _OfficialBuffer:
    def __init__(self, inputs: str):
        self._data = inputs.encode("utf-8")

    def read(self, *args):
        return self._data

    def readline(self, *args):
        return self._data.split(b"\n")[0] + b"\n"


class _Capture(io.StringIO):
    """The official stdout capture (a StringIO: no .buffer), ended past the output limit with the status
    a file-size limit gives (128 + SIGXFSZ), which the harness judges output_limit."""

    def __init__(self, limit: int):
        super().__init__()
        self._left = limit

    def write(self, text):
        self._left -= len(text)
        if self._left < 0:
            os._exit(128 + 25)
        return super().write(text)


def _run_stdin(cfg: dict, code: str, inputs: str) -> None:
    from unittest.mock import mock_open, patch

    source = as_function(code)
    try:
        compiled = compile(source, "solution.py", "exec")
    except BaseException as exc:  # noqa: BLE001
        print(f"compile error: {exc!r}", file=sys.stderr)
        os._exit(3)
    namespace = {"__name__": "tmp_sol", "__builtins__": __builtins__}
    _guard()
    timeout = float(cfg["timeout_s"])
    _arm(timeout)
    exec(compiled, namespace)
    if "class Solution" in source:  # the official runner instantiates it even for stdin programs
        namespace["Solution"]()
    _arm(0)
    method = namespace["wrapped_function"]
    lines = iter(inputs.split("\n"))
    real_stdout, captured = sys.stdout, _Capture(int(cfg["output_limit"]))
    captured.close = lambda x: 1  # as the official capture (closing it is an error there)
    # The official patches, in the order they take effect: the real stdin's read/readlines/readline (so a
    # `from sys import stdin` bound earlier reads the input, line endings dropped), then sys.stdin itself,
    # then builtins.open (the prelude's `from io import *` shadows it for most programs).
    patches = [patch("sys.stdin.read", lambda *a: inputs), patch("sys.stdin.readlines", lambda *a: inputs.split("\n")),
               patch("sys.stdin.readline", lambda *a: next(lines)), patch("sys.stdin", OfficialStdin(inputs)),
               patch("builtins.open", mock_open(read_data=inputs))]
    for p in patches:
        p.start()
    sys.stdout = captured
    failed = False
    try:
        _arm(timeout)
        method()
    except SystemExit:
        pass  # ignored officially, whatever its code: what was printed is judged
    except BaseException:  # noqa: BLE001 - a runtime error: the traceback goes to stderr
        import traceback

        failed = True
        traceback.print_exc()
    finally:
        _arm(0)
        sys.stdout = real_stdout
        for p in reversed(patches):
            p.stop()
    if failed:
        os._exit(1)
    os.write(cfg["result_fd"], captured.getvalue().encode("utf-8", "replace"))


# What the official runner's reliability_guard takes away from a program (calling them fails there).
_GUARDED = {"os": "kill system putenv remove removedirs rmdir fchdir setuid fork forkpty killpg rename renames "
                  "truncate replace unlink fchmod fchown chmod chown chroot lchflags lchmod lchown getcwd chdir",
            "shutil": "rmtree move chown", "subprocess": "Popen"}


def _guard() -> None:
    import builtins
    import faulthandler
    import importlib

    try:  # the official runner's process has numpy loaded before its guard (numpy's import calls os.putenv)
        importlib.import_module("numpy")
    except ImportError:
        pass
    faulthandler.disable()
    builtins.quit = None
    builtins.help = None
    os.environ["OMP_NUM_THREADS"] = "1"
    for module, names in _GUARDED.items():
        mod = importlib.import_module(module)
        for name in names.split():
            if hasattr(mod, name):
                setattr(mod, name, None)
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None


def encode_result(x):
    """JSON that keeps what the official in-process `==` would see: nested tuples stay tuples, dicts keep
    non-string keys, numpy scalars become the Python numbers they equal; anything else is opaque (equal
    to no expected value). fp8eval.scoring.sandbox.compare decodes it."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, list):
        return [encode_result(v) for v in x]
    if isinstance(x, tuple):
        return {"__tuple__": [encode_result(v) for v in x]}
    if isinstance(x, dict):
        return {"__dict__": [[encode_result(k), encode_result(v)] for k, v in x.items()]}
    if type(x).__module__ == "numpy" and getattr(x, "ndim", None) == 0 and hasattr(x, "item"):
        return encode_result(x.item())
    return {"__opaque__": repr(x)[:200]}


def _child_main(cfg: dict) -> None:
    with open(cfg["code_path"], encoding="utf-8") as f:
        code = f.read()
    with os.fdopen(cfg.pop("input_fd"), encoding="utf-8") as f:  # closed before the program runs
        cfg["input"] = f.read()
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


if __name__ == "__main__":
    _child_main(json.loads(sys.argv[1]))
