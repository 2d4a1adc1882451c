"""Verdicts and the official LiveCodeBench comparisons: stdin output line by line (stripped, then as
decimals), functional results with Python's `==` on what the program returned."""

from __future__ import annotations

import json
from dataclasses import dataclass, field


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
    """The official `prediction == json.loads(expected)`, on the child's encoded result (child.encode_result):
    numpy integers equal the numbers they are, a nested tuple never equals a list."""
    try:
        got = json.loads(result_json, object_hook=_decode)["result"]
        return bool(got == json.loads(expected))
    except (ValueError, KeyError, TypeError):
        return False


class _Opaque:
    """A result JSON cannot carry (a set, an object): equal to no expected value, as it is officially
    unless its own __eq__ says otherwise."""

    def __init__(self, text: str):
        self.text = text

    def __eq__(self, other) -> bool:
        return False

    __hash__ = object.__hash__


def _decode(obj: dict):
    if len(obj) == 1:
        (key, value), = obj.items()
        if key == "__tuple__":
            return tuple(value)
        if key == "__dict__":
            return {(tuple(k) if isinstance(k, list) else k): v for k, v in value}
        if key == "__opaque__":
            return _Opaque(value)
    return obj
