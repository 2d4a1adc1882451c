"""A MATH-500 oracle for the fake engine (`engine.script=benchmarks.math_oracle:answer`).

It answers like a model of about 60% accuracy writing full solutions, so the real scorer does real work:
for each (sample, repeat) a hash of the sample's seed decides whether the completion is the dataset's
worked solution (ends in `\\boxed{<gold>}`: scored by the exact check) or the same solution with a wrong
final answer. Wrong answers vary between repeats (off by 1 + seed mod 7), so verdicts are rarely reusable and
every wrong non-integer answer goes through math-verify (the pessimistic case for the harness).
"""

from __future__ import annotations

import functools
import hashlib
import json

from fp8eval.engines.base import Request
from fp8eval.tasks.base import TASK_DATA_ROOT
from fp8eval.tasks.reasoning_data import read_template

P_CORRECT = 0.6


@functools.lru_cache(maxsize=1)
def _table() -> tuple[str, str, dict[str, tuple[str, str]]]:
    """(prompt prefix, prompt suffix, problem -> (gold, solution)) from the shipped MATH-500 copy."""
    template = read_template("math500")
    prefix, _, suffix = template.partition("{problem}")
    rows = {}
    with open(TASK_DATA_ROOT / "math500" / "test.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            rows[row["problem"]] = (row["answer"], row["solution"])
    return prefix, suffix, rows


def _unit(seed: int) -> float:
    return int.from_bytes(hashlib.sha256(f"oracle:{seed}".encode()).digest()[:8], "big") / 2**64


def wrong_answer(gold: str, k: int) -> str:
    """A wrong answer of the gold's shape: an integer off by k, else the expression plus k."""
    s = gold.strip()
    if s.lstrip("+-").isdigit():
        return str(int(s) + k)
    return f"{s}+{k}"


def answer(req: Request, i: int) -> str:
    prefix, suffix, rows = _table()
    text = next(m["content"] for m in reversed(req.messages) if m["role"] == "user")
    problem = text[len(prefix): len(text) - len(suffix)] if suffix else text[len(prefix):]
    if problem not in rows:
        return "I cannot solve this."
    gold, solution = rows[problem]
    if _unit(req.seeds[i]) < P_CORRECT:
        return f"{solution}\nTherefore, the final answer is: $\\boxed{{{gold}}}$. I hope it is correct"
    wrong = wrong_answer(gold, 1 + req.seeds[i] % 7)
    return f"{solution}\nTherefore, the final answer is: $\\boxed{{{wrong}}}$. I hope it is correct"
