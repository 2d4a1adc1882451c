"""Exactly one record per (sample, repeat).

A store can hold several lines for one key: a rerun after an error appends the good answer, a crash
between two appends can leave a duplicate. The rule every view uses: the last record that is done (ok or
skipped) wins; a key with only errors keeps its last error. Lines replaced this way are counted.
"""

from __future__ import annotations

from typing import Callable, Iterable, TypeVar

T = TypeVar("T")
DONE_STATUSES = ("ok", "skipped")


def record_key(rec: dict) -> tuple[str, int]:
    """(sample_id, repeat): the unit every record, pairing and resume works with."""
    return str(rec["sample_id"]), int(rec["repeat"])


def one_per_key(items: Iterable[T], data: Callable[[T], dict] = lambda r: r) -> tuple[list[T], int]:
    """The winning item per key in first-seen key order, and how many items were replaced.

    `data(item)` gives the record dict (items may carry more, e.g. the report's line numbers)."""
    chosen: dict[tuple[str, int], T] = {}
    n = 0
    for item in items:
        n += 1
        rec = data(item)
        key = record_key(rec)
        old = chosen.get(key)
        if old is None or rec.get("status") in DONE_STATUSES or data(old).get("status") not in DONE_STATUSES:
            chosen[key] = item
    return list(chosen.values()), n - len(chosen)


def is_scored(rec: dict) -> bool:
    """An ok record with a score: the only kind that counts toward a mean."""
    return rec.get("status") == "ok" and rec.get("score") is not None
