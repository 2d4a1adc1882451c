"""Needle-in-a-haystack scoring, RULER's string_match_all: the needle's value appears in the answer."""

from __future__ import annotations


def niah_score(completion: str, values: list[str] | str) -> float:
    """Fraction of the expected values that appear in the completion (1.0 or 0.0 for one needle)."""
    if isinstance(values, str):
        values = [values]
    if not values:
        raise ValueError("niah_score needs at least one expected value")
    return sum(1.0 for v in values if v in completion) / len(values)
