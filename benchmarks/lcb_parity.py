"""LiveCodeBench verdict parity: fp8eval's sandbox against the official evaluator, program by program.

Each probe is a small program written here (stdin idioms, functional return types, limits) with the verdict
the official evaluator gave when this table was made (`official`). tests/test_lcb_official.py checks the
sandbox still gives those verdicts; this script re-asks the official evaluator itself:

    git clone https://github.com/LiveCodeBench/LiveCodeBench LCB   # read-only; nothing of it is copied here
    PYTHONPATH=$PWD .venv/bin/python benchmarks/lcb_parity.py --lcb-repo LCB

It imports `lcb_runner.evaluation.compute_code_generation_metrics.check_correctness` from that checkout (which
runs the program in a worker process with testing_util's run_test), runs every probe there and here with the
same limit, and prints one line per probe and the number of disagreements (exit status 1 if any).
"""

from __future__ import annotations

import argparse
import json
import sys

STDIN_IN, STDIN_OUT = ["3\n1 2 3\n", "2\n5 5\n"], ["6\n", "10\n"]
SUM = "n=int(input())\nprint(sum(map(int,input().split())))"

# name -> (program, official verdict on STDIN_IN / STDIN_OUT with a 2 s limit)
STDIN_PROBES: dict[str, tuple[str, bool]] = {
    "input()": (SUM, True),
    "from sys import stdin": ("from sys import stdin\nn=int(stdin.readline())\n"
                              "print(sum(map(int,stdin.readline().split())))", True),
    "input = sys.stdin.readline": ("import sys\ninput=sys.stdin.readline\n" + SUM, True),
    "for line in sys.stdin": ("import sys\nls=[l for l in sys.stdin]\nprint(sum(map(int,ls[1].split())))", False),
    "sys.stdin.buffer.readline": ("import sys\ninput=sys.stdin.buffer.readline\n" + SUM, False),
    "sys.stdin.buffer.read": ("import sys\nd=sys.stdin.buffer.read().split()\nprint(sum(map(int,d[1:])))", True),
    "sys.stdin.readlines": ("import sys\nls=sys.stdin.readlines()\nprint(sum(map(int,ls[1].split())))", True),
    "sys.stdout.write": ("import sys\nd=sys.stdin.read().split()\nsys.stdout.write(str(sum(map(int,d[1:])))+'\\n')",
                         True),
    "sys.stdout.buffer.write": ("import sys\nd=sys.stdin.read().split()\n"
                                "sys.stdout.buffer.write(str(sum(map(int,d[1:]))).encode())", False),
    "open(0)": ("d=open(0).read().split()\nprint(sum(map(int,d[1:])))", False),
    "os.write(1)": ("import os\nn=int(input())\nos.write(1, (str(sum(map(int,input().split())))+'\\n').encode())",
                    False),
    "input() until EOFError": ("tot=0\nn=int(input())\nwhile True:\n    try:\n        line=input()\n"
                               "    except EOFError:\n        break\n    tot+=sum(map(int,line.split()))\nprint(tot)",
                               True),
    "global in main()": ("def main():\n    global s\n    s=0\n    n=int(input())\n"
                         "    s=sum(map(int,input().split()))\n    print(s)\nmain()", True),
    "global at top level": ("s=0\ndef add(v):\n    global s\n    s+=v\nn=int(input())\n"
                            "for v in map(int,input().split()):\n    add(v)\nprint(s)", False),
    "__main__ guard": ("def main():\n" + "".join("    " + line + "\n" for line in SUM.split("\n"))
                       + "if __name__ == '__main__':\n    main()", True),
    "10**6000 printed": ("n=int(input())\nv=list(map(int,input().split()))\nprint(len(str(10**6000))-6001+sum(v))",
                         True),
    "threading.Thread": ("import threading\ndef m():\n" + "".join("    " + line + "\n" for line in SUM.split("\n"))
                         + "t=threading.Thread(target=m)\nt.start()\nt.join()", True),
    "print then sys.exit(1)": ("import sys\n" + SUM + "\nsys.exit(1)", True),
    "print then exit()": (SUM + "\nexit()", True),
    "2.5 s with a 2 s limit": ("import time\nn=int(input())\ntime.sleep(2.5)\nprint(sum(map(int,input().split())))",
                               False),
    "os without import": ("n=int(input())\nprint(sum(map(int,input().split())) if os.sep else 0)", False),
    "datetime is the module": ("n=int(input())\nprint(sum(map(int,input().split()))"
                               " + datetime.date(2020,1,1).day - 1)", True),
    "os.getcwd (guarded)": ("import os\nos.getcwd()\n" + SUM, False),
    "class Solution in a stdin program": ("class Solution: pass\n" + SUM, False),
    "syntax error": ("print(1", False),
    "deep recursion": ("import sys\nsys.setrecursionlimit(10**6)\ndef f(k):\n    return 0 if k==0 else 1+f(k-1)\n"
                       "n=int(input())\nprint(sum(map(int,input().split()))+f(3000)-3000)", True),
}

FUNC_IN, FUNC_OUT = ["1\n2", "3\n4"], ["3", "7"]
# name -> (program, function name, inputs, outputs, official verdict with a 2 s limit)
FUNCTIONAL_PROBES: dict[str, tuple[str, str, list[str], list[str], bool]] = {
    "Solution method": ("class Solution:\n    def add(self, a, b):\n        return a + b", "add", FUNC_IN, FUNC_OUT,
                        True),
    "module-level function": ("def add(a, b):\n    return a + b", "add", FUNC_IN, FUNC_OUT, True),
    "numpy integer": ("import numpy as np\nclass Solution:\n    def add(self, a, b):\n        return np.int64(a) + b",
                      "add", FUNC_IN, FUNC_OUT, True),
    "one-element tuple for an int": ("class Solution:\n    def add(self, a, b):\n        return (a + b,)", "add",
                                     FUNC_IN, FUNC_OUT, False),
    "nested tuple": ("class Solution:\n    def f(self, a):\n        return [(a, a)]", "f", ["1"], ["[[1, 1]]"], False),
    "top-level tuple": ("class Solution:\n    def f(self, a):\n        return (a, a)", "f", ["1"], ["[1, 1]"], True),
    "dict with int keys": ("class Solution:\n    def f(self, a):\n        return {a: a}", "f", ["1"], ['{"1": 1}'],
                           False),
    "float for an int": ("class Solution:\n    def f(self, a):\n        return a * 1.0", "f", ["1"], ["1"], True),
    "set for a list": ("class Solution:\n    def f(self, a):\n        return {a}", "f", ["1"], ["[1]"], False),
}


def ours_stdin(code: str, timeout_s: float = 2.0) -> bool:
    from fp8eval.scoring.sandbox import run_tests_detailed

    tests = [{"input": i, "output": o} for i, o in zip(STDIN_IN, STDIN_OUT)]
    return all(v.passed for v in run_tests_detailed(code, tests, "stdin", timeout_s=timeout_s))


def ours_functional(code: str, fn: str, inputs: list[str], outputs: list[str], timeout_s: float = 2.0) -> bool:
    from fp8eval.scoring.sandbox import run_tests_detailed

    tests = [{"input": i, "output": o} for i, o in zip(inputs, outputs)]
    return all(v.passed for v in run_tests_detailed(code, tests, "functional", fn, timeout_s=timeout_s))


def _official(check_correctness, code: str, inputs: list[str], outputs: list[str], fn: str | None) -> bool:
    sample = {"input_output": json.dumps({"inputs": inputs, "outputs": outputs, "fn_name": fn})}
    results = check_correctness(sample, code, timeout=2, debug=False)[0]
    # True, or numpy's bool for a functional `==` (the official metrics code converts those to bool).
    return len(results) == len(inputs) and all(r is True or (hasattr(r, "dtype") and bool(r)) for r in results)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lcb-repo", required=True, help="a LiveCodeBench checkout (its lcb_runner is imported)")
    args = ap.parse_args()
    sys.path.insert(0, args.lcb_repo)
    from lcb_runner.evaluation.compute_code_generation_metrics import check_correctness

    rows = [(f"stdin {k}", code, STDIN_IN, STDIN_OUT, None, rec) for k, (code, rec) in STDIN_PROBES.items()]
    rows += [(f"functional {k}", code, i, o, fn, rec) for k, (code, fn, i, o, rec) in FUNCTIONAL_PROBES.items()]
    disagree = 0
    for name, code, inputs, outputs, fn, recorded in rows:
        official = _official(check_correctness, code, inputs, outputs, fn)
        ours = ours_functional(code, fn, inputs, outputs) if fn else ours_stdin(code)
        disagree += official != ours
        note = "" if official == recorded else f" (table says {recorded})"
        print(f"{'same' if official == ours else 'DIFF'}  {name}: official={official} fp8eval={ours}{note}")
    print(f"{len(rows)} probes, {disagree} disagreements")
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
