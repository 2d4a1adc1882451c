"""The one CSV writer: a text cell a spreadsheet would run as a formula is written as text.

A cell that starts with `=`, `+`, `-`, `@` (or a tab or carriage return, which some spreadsheets skip before
reading a formula) is prefixed with `'`, the spreadsheet's "this is text" mark (OWASP's CSV-injection advice):
a model's answer `=HYPERLINK(...)` in flips.csv stays an answer. Numbers (a negative gap) are never touched;
only string cells are. `guarded_cells` counts the cells changed.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def guard_cell(value: Any) -> Any:
    """A string cell that could start a formula, prefixed with `'`; anything else unchanged."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def guarded_cells(frame) -> int:
    """How many string cells of a DataFrame `guard_cell` changes."""
    return int(sum(frame[c].map(lambda v: guard_cell(v) is not v).sum() for c in frame.columns if _text(frame[c])))


def _text(column) -> bool:
    """A column that may hold strings (object or string dtype; not numbers, booleans or times)."""
    return getattr(column.dtype, "kind", "O") not in "biufcmM"


def write_csv(frame, path: Path) -> int:
    """Write a pandas DataFrame as CSV (no index), every string cell through `guard_cell`, column names
    included; returns how many cells were guarded."""
    out = frame.copy()
    n = guarded_cells(out)
    for c in out.columns:
        if _text(out[c]):
            out[c] = out[c].map(guard_cell)
    out.columns = [guard_cell(str(c)) for c in out.columns]
    # every string cell quoted: a cell holding a bare carriage return stays one cell (pandas' minimal quoting
    # leaves "\r" bare, and a reader takes it for the end of the row)
    out.to_csv(Path(path), index=False, quoting=csv.QUOTE_NONNUMERIC)
    return n
