"""The code sandbox: correct / wrong / timeout programs of both test types, and the red-team suite.

Every hostile program prints the expected output "ok" only when its attack worked, so a contained
attack is scored False and an escaped one would be scored True; side effects are checked as well.
The red-team suite runs twice: with namespaces (what this machine gives) and with them disabled (the
fallback a container without CAP_SYS_ADMIN gets: uid drop when root + in-process socket block).
"""

from __future__ import annotations

import os
import socket
import subprocess
import textwrap
import time
import uuid

import pytest

from fp8eval.scoring.sandbox import compare_functional, compare_stdout, run_tests, run_tests_detailed
from fp8eval.scoring.sandbox import harness as sandbox

OK = [{"input": "", "output": "ok"}]
T = 2.0  # per-test timeout for the hostile programs: the suite stays well under a minute on 2 cores


def prog(src: str) -> str:
    return textwrap.dedent(src).strip() + "\n"


# ----------------------------------------------------------------------------------- comparison
def test_compare_stdout_like_lcb():
    assert compare_stdout("1 2\n3\n", "1 2\n3")
    assert compare_stdout("  1 2  \n3   \n\n", "1 2\n3")
    assert compare_stdout("0.50\n", "0.5\n")  # decimals compare as numbers
    assert compare_stdout("1 2.0", "1 2")
    assert not compare_stdout("1 2\n3\n4", "1 2\n3")
    assert not compare_stdout("Yes", "No")
    assert not compare_stdout("1  2", "12")
    assert not compare_stdout("", "1")


def test_compare_functional():
    assert compare_functional('{"result": [1, 2]}', "[1, 2]")
    assert not compare_functional('{"result": [2, 1]}', "[1, 2]")
    assert not compare_functional("", "1")
    assert not compare_functional("garbage", "1")


# ----------------------------------------------------------------------------------- both test types
STDIN_SUM = prog("""
    a, b = map(int, input().split())
    print(a + b)
""")
STDIN_TESTS = [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4\n", "output": "6"}]


def test_stdin_correct_incorrect_timeout():
    assert run_tests(STDIN_SUM, STDIN_TESTS, "stdin") == [True, True]
    wrong = STDIN_SUM.replace("a + b", "a - b")
    assert run_tests(wrong, STDIN_TESTS, "stdin") == [False, False]
    slow = "while True:\n    pass\n"
    t0 = time.monotonic()
    verdicts = run_tests_detailed(slow, STDIN_TESTS[:1], "stdin", timeout_s=1.0)
    assert [v.status for v in verdicts] == ["timeout"]
    assert time.monotonic() - t0 < 1.0 + sandbox.STARTUP_ALLOWANCE_S + 3
    crash = "raise ValueError('boom')\n"
    (v,) = run_tests_detailed(crash, STDIN_TESTS[:1], "stdin")
    assert v.status == "runtime_error" and "boom" in v.stderr_tail
    assert run_tests("print(3", STDIN_TESTS[:1], "stdin") == [False]  # syntax error


def test_stdin_main_guard_and_prelude():
    code = prog("""
        def main():
            n = int(input())
            print(gcd(n, 12), deque([1]).pop())  # gcd, deque from the LCB-style prelude
        if __name__ == "__main__":
            main()
    """)
    assert run_tests(code, [{"input": "18\n", "output": "6 1\n"}], "stdin") == [True]


LEET = prog("""
    class Solution:
        def maxPair(self, nums: List[int], k: int) -> List[int]:
            nums = sorted(nums)
            return [nums[-1] * k, nums[0] * k]
""")
LEET_TESTS = [{"input": "[3, 1, 2]\n2", "output": "[6, 2]"}, {"input": "[5]\n1", "output": "[5, 5]"}]


def test_functional_correct_incorrect_timeout():
    assert run_tests(LEET, LEET_TESTS, "functional", func_name="maxPair") == [True, True]
    wrong = LEET.replace("nums[-1] * k", "nums[-1]")
    assert run_tests(wrong, LEET_TESTS, "functional", func_name="maxPair") == [False, True]
    tuple_result = LEET.replace("return [nums[-1] * k, nums[0] * k]", "return (nums[-1] * k, nums[0] * k)")
    assert run_tests(tuple_result, LEET_TESTS, "functional", func_name="maxPair") == [True, True]
    slow = LEET.replace("nums = sorted(nums)", "while True: pass")
    verdicts = run_tests_detailed(slow, LEET_TESTS[:1], "functional", "maxPair", timeout_s=1.0)
    assert [v.status for v in verdicts] == ["timeout"]
    missing = LEET.replace("maxPair", "otherName")
    assert run_tests(missing, LEET_TESTS[:1], "functional", func_name="maxPair") == [False]


def test_printing_the_answer_does_not_pass_a_functional_test():
    code = "class Solution:\n    def f(self, x):\n        print(x)\n        return None\n"
    assert run_tests(code, [{"input": "7", "output": "7"}], "functional", func_name="f") == [False]


def test_stop_on_failure_and_argument_errors():
    tests = [{"input": "1 1", "output": "3"}] + STDIN_TESTS * 4
    verdicts = run_tests_detailed(STDIN_SUM, tests, "stdin", stop_on_failure=True, max_workers=1)
    assert verdicts[0].status == "wrong_answer"
    assert all(v.status == "not_run" and not v.passed for v in verdicts[1:])
    with pytest.raises(ValueError, match="testtype"):
        run_tests(STDIN_SUM, STDIN_TESTS, "stdio")
    with pytest.raises(ValueError, match="func_name"):
        run_tests(LEET, LEET_TESTS, "functional")
    assert run_tests(STDIN_SUM, [], "stdin") == []


# ----------------------------------------------------------------------------------- red team
def _sandbox_processes() -> list[int]:
    """Processes still alive that were started by the sandbox (its child bootstrap or descendants)."""
    me = os.getpid()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
        except OSError:
            continue
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        zombie = "\nState:\tZ" in status
        ours = b"fp8eval/scoring/sandbox/child.py" in cmd or (
            os.getuid() == 0 and sandbox.ROOT_UID_BASE <= uid < sandbox.ROOT_UID_BASE + 64
        )
        if ours and not zombie:
            found.append(int(pid))
    return found


@pytest.fixture(params=["namespaces", "fallback"])
def mode(request, monkeypatch):
    if request.param == "fallback":
        if os.getuid() != 0:
            pytest.skip("the fallback containment relies on the uid drop, which needs root")
        monkeypatch.setattr(sandbox, "USE_NAMESPACES", False)
    return request.param


@pytest.fixture
def outside_tmp():
    """A fresh directory outside /tmp (which the sandbox may replace by a private tmpfs, hiding what is
    there): under the repository's git-ignored outputs/."""
    import shutil

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(repo, "outputs", f".redteam-{uuid.uuid4().hex}")
    os.makedirs(path)
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sentinel():
    """A process of the harness's own user, standing in for the harness and its other children."""
    p = subprocess.Popen(["sleep", "120"])
    yield p
    p.kill()
    p.wait()


def _check(code: str, expect_status: set[str], timeout_s: float = T, **kw):
    t0 = time.monotonic()
    (v,) = run_tests_detailed(code, OK, "stdin", timeout_s=timeout_s, **kw)
    wall = time.monotonic() - t0
    assert not v.passed, f"attack escaped: {v}"
    assert v.status in expect_status, v
    assert wall < timeout_s + sandbox.STARTUP_ALLOWANCE_S + 5, wall
    assert _sandbox_processes() == [], "a sandboxed process outlived its run"
    return v


# The hostile programs call posix.* (the module behind os): the official runner's guard, which the sandbox
# applies too, sets os.fork, os.kill, os.remove, ... to None, and an attacker would go around it like this.
def test_fork_bomb(mode):
    code = prog("""
        import posix
        while True:
            try:
                posix.fork()
            except OSError:
                pass
    """)
    _check(code, {"timeout", "runtime_error"})


def test_infinite_loop(mode):
    _check("while True:\n    pass\n", {"timeout"})


def test_sleep_past_timeout(mode):
    v = _check("import time\ntime.sleep(100)\nprint('ok')\n", {"timeout"})
    assert v.wall_s < T + sandbox.STARTUP_ALLOWANCE_S + 1


def test_memory_bomb_one_huge_allocation(mode):
    v = _check("x = bytearray(1 << 40)\n", {"runtime_error"})
    assert "MemoryError" in v.stderr_tail


def test_memory_bomb_touched_pages(mode):
    code = "x = []\nwhile True:\n    x.append(b'y' * (1 << 24))\n"
    # Page faults are slow on small VMs: a timeout is as contained as the MemoryError.
    _check(code, {"runtime_error", "timeout"}, memory_mb=256)


def test_huge_output(mode):
    code = "while True:\n    print('x' * 100000)\n"
    _check(code, {"output_limit"}, output_limit=1 << 20)


def test_daemon_escaping_the_process_group_is_reaped(mode):
    code = prog("""
        import os, posix, time
        if posix.fork() == 0:
            os.setsid()
            if posix.fork() == 0:
                time.sleep(300)
            os._exit(0)
        print('not ok')
    """)
    _check(code, {"wrong_answer"})


def test_writing_outside_the_temp_dir(mode, tmp_path, outside_tmp):
    here = os.path.dirname(os.path.abspath(__file__))
    escapes = [str(tmp_path / "pwned.txt"), os.path.join(here, f"pwned-{uuid.uuid4().hex}"),
               os.path.join(outside_tmp, "pwned.txt")]
    # The shared /tmp: writable in the program's view (a private tmpfs, or /tmp itself in the fallback,
    # cleaned after the run), so it is checked only on the harness's side.
    shared_tmp = f"/tmp/fp8eval-redteam-{uuid.uuid4().hex}"
    code = prog(f"""
        ok = False
        for path in {escapes!r}:
            try:
                with open(path, 'w') as f:
                    f.write('pwned')
                ok = True
            except OSError:
                pass
        with open({shared_tmp!r}, 'w') as f:
            f.write('pwned')
        with open('inside.txt', 'w') as f:  # the work dir itself is writable
            f.write('fine')
        if ok:
            print('ok')
    """)
    try:
        _check(code, {"wrong_answer"})
    finally:
        leaked = [p for p in escapes + [shared_tmp] if os.path.exists(p)]
        for path in leaked:
            os.unlink(path)
    assert leaked == []


def test_reading_home_and_environment_secrets(mode, outside_tmp, monkeypatch):
    import pathlib

    secret = f"SECRET-{uuid.uuid4().hex}"
    home = pathlib.Path(outside_tmp) / "home"
    home.mkdir()
    (home / ".netrc").write_text(secret)
    # With a mount namespace the home is hidden whatever its mode; without one (fallback) only its
    # permissions protect it, so there it gets a real home's 0700.
    os.chmod(home, 0o755 if mode == "namespaces" else 0o700)
    os.chmod(home / ".netrc", 0o644)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("FP8EVAL_API_KEY", secret)
    holder = subprocess.Popen(["sleep", "120"], env={"FP8EVAL_API_KEY": secret})
    try:
        code = prog(f"""
            import os, glob
            found = any({secret!r} in v for v in os.environ.values())
            for path in [{str(home / ".netrc")!r}, os.path.expanduser('~/.netrc')] + glob.glob('/proc/*/environ'):
                try:
                    with open(path, 'rb') as f:
                        found = found or {secret!r}.encode() in f.read()
                except OSError:
                    pass
            try:
                os.listdir('/root')
                found = found or os.getuid() == 0
            except OSError:
                pass
            if found:
                print('ok')
        """)
        _check(code, {"wrong_answer"})
    finally:
        holder.kill()
        holder.wait()


def test_network_socket(mode):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    code = prog(f"""
        import socket
        try:
            s = socket.create_connection(('127.0.0.1', {port}), timeout=1)
            s.sendall(b'hello')
            print('ok')
        except OSError:
            pass
    """)
    try:
        v = _check(code, {"wrong_answer", "runtime_error"})
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()
    if mode == "fallback":
        assert v.isolation.get("socket_block") == "audit-hook"
    else:
        assert v.isolation.get("netns") is True


def test_killing_the_parent_and_others(mode, sentinel):
    code = prog(f"""
        import os, posix, signal
        killed = False
        for pid in ({sentinel.pid}, os.getppid()):
            try:
                if pid > 1:
                    posix.kill(pid, signal.SIGKILL)
                    killed = True
            except OSError:
                pass
        if killed:
            print('ok')
        posix.kill(-1, signal.SIGKILL)  # everything this program may signal
    """)
    _check(code, {"wrong_answer", "runtime_error"})
    time.sleep(0.2)
    assert sentinel.poll() is None, "the sandboxed program killed a harness process"
    assert run_tests(STDIN_SUM, STDIN_TESTS, "stdin") == [True, True]  # the harness still works


def test_deleting_files(mode, outside_tmp):
    import pathlib

    victim_dir = pathlib.Path(outside_tmp) / "data"
    victim_dir.mkdir()
    victim = victim_dir / "keep.txt"
    victim.write_text("precious")
    os.chmod(victim_dir, 0o755)
    code = prog(f"""
        import os, posix
        seen = os.path.exists({str(victim)!r})  # a hidden file (private /tmp) cannot be deleted either
        for remove, path in ((posix.remove, {str(victim)!r}), (posix.rmdir, {str(victim_dir)!r})):
            try:
                remove(path)
            except OSError:
                pass
        if seen and not os.path.exists({str(victim)!r}):
            print('ok')
    """)
    _check(code, {"wrong_answer"})
    assert victim.read_text() == "precious"


def test_harness_records_every_verdict_in_one_batch(mode):
    """Hostile programs back to back, then an honest one: every verdict is recorded, the last passes."""
    hostile = [
        "while True:\n    pass\n",
        "import os, posix\nposix.kill(os.getppid(), 9)\n",
        "import sys\nsys.stdout.write('x' * (1 << 22))\n",
    ]
    verdicts = [run_tests_detailed(c, OK, "stdin", timeout_s=1.0, output_limit=1 << 20)[0] for c in hostile]
    assert [v.passed for v in verdicts] == [False, False, False]
    assert verdicts[0].status == "timeout" and verdicts[2].status == "output_limit"
    assert run_tests("print('ok')\n", OK, "stdin") == [True]


def test_isolation_report():
    info = sandbox.isolation()
    assert info["works"] is True
    if os.getuid() == 0:
        assert sandbox.ROOT_UID_BASE <= info["uid"] < sandbox.ROOT_UID_BASE + 64


@pytest.mark.skipif(os.getuid() != 0 or not os.access("/usr/bin/python3", os.X_OK),
                    reason="needs root to switch to nobody, and a system python nobody can run")
def test_non_root_harness(tmp_path):
    """The harness running as an ordinary user (nobody): honest programs pass, attacks stay contained."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = prog(f"""
        import sys, os
        sys.path.insert(0, {repo!r})
        from fp8eval.scoring.sandbox import run_tests_detailed
        ok = [{{"input": "", "output": "ok"}}]
        r1 = run_tests_detailed("print('ok')", ok, "stdin")[0]
        r2 = run_tests_detailed("import posix\\nwhile True:\\n    try: posix.fork()\\n    except OSError: pass",
                                ok, "stdin", timeout_s=1.0)[0]
        r3 = run_tests_detailed("import socket\\nsocket.create_connection(('127.0.0.1', 1), timeout=1)\\nprint('ok')",
                                ok, "stdin")[0]
        print(r1.passed, r1.isolation.get("userns"), r2.passed, r3.passed)
    """)
    out = subprocess.run(
        ["/usr/bin/python3", "-c", script], user="nobody", group="nogroup", capture_output=True, text=True,
        timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
    )
    if out.returncode != 0 and "Permission denied" in out.stderr:
        pytest.skip("nobody cannot read the repository here")
    assert out.returncode == 0, out.stderr
    passed, userns, bomb, net = out.stdout.split()
    assert passed == "True" and bomb == "False" and net == "False", out.stdout
