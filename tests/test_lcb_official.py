"""LiveCodeBench verdicts as the official evaluator (lcb_runner/evaluation/testing_util.py and
lcb_runner/utils/extraction_utils.py) gives them, one test per point where fp8eval used to differ."""

from __future__ import annotations

import pytest

from fp8eval.scoring.code import extract_code
from fp8eval.scoring.sandbox import run_tests_detailed
from fp8eval.tasks.livecodebench import in_window

T = 1.0  # a short per-test limit keeps these fast; the semantics are those of the official 6 s


def test_limit_is_the_programs_wall_time():
    """Officially signal.alarm(timeout) from the program's start: a run of limit + 0.5 s times out (it used
    to pass here, under the harness's kill at limit + start-up allowance)."""
    (v,) = run_tests_detailed("import time\ntime.sleep(1.5)\nprint('ok')", [{"input": "", "output": "ok"}],
                              "stdin", timeout_s=T)
    assert v.status == "timeout", v
    (v,) = run_tests_detailed("import time\ntime.sleep(0.2)\nprint('ok')", [{"input": "", "output": "ok"}],
                              "stdin", timeout_s=T)
    assert v.passed, v


def test_functional_module_level_function():
    code = "def addTwo(a, b):\n    return a + b\n"
    (v,) = run_tests_detailed(code, [{"input": "2\n3", "output": "5"}], "functional", "addTwo", timeout_s=T)
    assert v.passed, v


def test_output_then_sys_exit_1_passes():
    (v,) = run_tests_detailed("import sys\nprint(42)\nsys.exit(1)", [{"input": "", "output": "42"}], "stdin",
                              timeout_s=T)
    assert v.passed, v


def test_numpy_integers_and_tuples_compare_as_official_eq():
    pytest.importorskip("numpy")
    code = ("import numpy as np\nclass Solution:\n    def f(self, a):\n        return np.int64(a) + 1\n"
            "    def pair(self, a):\n        return (a, a)\n    def nested(self, a):\n        return [(a, a)]\n")
    assert run_tests_detailed(code, [{"input": "4", "output": "5"}], "functional", "f", timeout_s=T)[0].passed
    # a top-level tuple counts as a list; a nested tuple is a tuple, and (4, 4) != [4, 4]
    assert run_tests_detailed(code, [{"input": "4", "output": "[4, 4]"}], "functional", "pair", timeout_s=T)[0].passed
    (v,) = run_tests_detailed(code, [{"input": "4", "output": "[[4, 4]]"}], "functional", "nested", timeout_s=T)
    assert v.status == "wrong_answer", v


def test_extraction_fence_opened_mid_line_and_unclosed_last_fence():
    assert extract_code("Here it is: ```python\nprint(1)\n```") == "print(1)"
    assert extract_code("```python\na=1\n```\nthe fix:\n```python\nb=2") == "the fix:"
    assert extract_code("```python\nprint(1)") is None  # one fence line: officially "", which fails


def test_date_window_includes_the_end_date():
    assert in_window("2025-05-01T00:00:00", "2025-02-01", "2025-05-01")
    assert not in_window("2025-05-01T18:30:00", "2025-02-01", "2025-05-01")  # after midnight of the end date
    assert in_window("2025-02-01T00:00:00", "2025-02-01", "2025-05-01")
    assert not in_window("2025-01-31T23:00:00", "2025-02-01", "2025-05-01")


# Official verdicts of stdin idioms, observed with lcb_runner's own check_correctness (LiveCodeBench commit
# 28fef95, testing_util.py + compute_code_generation_metrics.py run as they are) on input "3\n1 2 3\n",
# expected "6\n". The official runner calls the program as a function under mocked stdin / captured stdout.
SUM = "n=int(input())\nprint(sum(map(int,input().split())))"
OFFICIAL_STDIN = {
    "from sys import stdin": ("from sys import stdin\nn=int(stdin.readline())\n"
                              "print(sum(map(int,stdin.readline().split())))", True),
    "for line in sys.stdin": ("import sys\nls=[l for l in sys.stdin]\nprint(sum(map(int,ls[1].split())))", False),
    "sys.stdin.buffer.readline": ("import sys\ninput=sys.stdin.buffer.readline\n" + SUM, False),
    "sys.stdin.buffer.read": ("import sys\nd=sys.stdin.buffer.read().split()\nprint(sum(map(int,d[1:])))", True),
    "sys.stdout.buffer.write": ("import sys\nd=sys.stdin.read().split()\n"
                                "sys.stdout.buffer.write(str(sum(map(int,d[1:]))).encode())", False),
    "open(0)": ("d=open(0).read().split()\nprint(sum(map(int,d[1:])))", False),
    "os.write(1)": ("import os\nn=int(input())\nos.write(1, (str(sum(map(int,input().split())))+'\\n').encode())",
                    False),
    "global at top level": ("s=0\ndef add(v):\n    global s\n    s+=v\nn=int(input())\n"
                            "for v in map(int,input().split()):\n    add(v)\nprint(s)", False),
    "__main__ guard": ("def main():\n" + "".join("    " + line + "\n" for line in SUM.split("\n"))
                       + "if __name__ == '__main__':\n    main()", True),
    "exit()": (SUM + "\nexit()", True),
    "os without import": ("n=int(input())\nprint(sum(map(int,input().split())) if os.sep else 0)", False),
    "datetime is the module": ("n=int(input())\nprint(sum(map(int,input().split()))"
                               " + datetime.date(2020,1,1).day - 1)", True),
    "os.getcwd (guarded)": ("import os\nos.getcwd()\n" + SUM, False),
    "10**6000 printed": ("n=int(input())\nv=list(map(int,input().split()))\nprint(len(str(10**6000))-6001+sum(v))",
                         True),
    "input() until EOFError": ("tot=0\nn=int(input())\nwhile True:\n    try:\n        line=input()\n"
                               "    except EOFError:\n        break\n    tot+=sum(map(int,line.split()))\nprint(tot)",
                               True),
}


@pytest.mark.parametrize("name", sorted(OFFICIAL_STDIN))
def test_stdin_idioms_as_official(name):
    code, official = OFFICIAL_STDIN[name]
    (v,) = run_tests_detailed(code, [{"input": "3\n1 2 3\n", "output": "6\n"}], "stdin", timeout_s=6.0)
    assert v.passed is official, v
