"""Record lines: canonical JSON, fingerprints, and a scanner that never stops at a bad line.

A line that is not JSON, or JSON that is not a record, is a `LineProblem` naming its file and line; the
scan goes on, so one torn or hand-edited line can never block a run or hide the records after it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8eval.core.hashing import canonical_json, fingerprint_hash  # noqa: F401 - re-exported

# 2: seeds are the sample's seed + repeat (fp8eval.seeds), so records seeded otherwise are never reused.
RECORD_SCHEMA = 2

# Fields a line must carry to be a record at all (the reader then checks that they match the arm).
REQUIRED_FIELDS = ("arm", "task", "sample_id", "repeat", "status")
STATUSES = ("ok", "skipped", "error")


@dataclass
class LineProblem:
    """A line set aside: where it is and why (`corrupt_line`, `not_a_record`, `torn_tail`)."""

    path: Path
    line: int
    reason: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}: {self.detail}"


def record_problem(obj: Any) -> str | None:
    """Why a parsed JSON value is not a record (None when it is one)."""
    if not isinstance(obj, dict):
        return f"a JSON {type(obj).__name__}, not an object"
    missing = [k for k in REQUIRED_FIELDS if k not in obj]
    if missing:
        return "missing " + ", ".join(missing)
    if not isinstance(obj["repeat"], int) or isinstance(obj["repeat"], bool) or obj["repeat"] < 0:
        return f"repeat {obj['repeat']!r} is not a non-negative integer"
    if obj["status"] not in STATUSES:
        return f"status {obj['status']!r} is not one of {', '.join(STATUSES)}"
    if obj["status"] == "ok" and not isinstance(obj.get("score"), (int, float)):
        return "status ok without a numeric score"
    return None


@dataclass
class FileScan:
    """Incremental reader of one append-only JSONL file: `advance()` parses only the bytes appended since
    the last call, so a writer polling the files of other writers reads each byte once."""

    path: Path
    offset: int = 0
    line_no: int = 0
    records: list[tuple[int, dict]] = field(default_factory=list)  # (line number, record)
    problems: list[LineProblem] = field(default_factory=list)
    torn: LineProblem | None = None  # an unterminated last line: a write in progress or a killed writer

    def advance(self) -> bool:
        """Read what was appended; True when anything new was parsed."""
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self.offset:  # rewritten (repair): start again
                    self.offset, self.line_no, self.records, self.problems = 0, 0, [], []
                if size == self.offset:
                    return False
                f.seek(self.offset)
                data = f.read(size - self.offset)
        except FileNotFoundError:
            return False
        cut = data.rfind(b"\n") + 1
        complete, rest = data[:cut], data[cut:]
        for raw in complete.split(b"\n")[:-1]:
            self.line_no += 1
            self._parse(raw, self.line_no)
        self.offset += cut
        self.torn = (LineProblem(self.path, self.line_no + 1, "torn_tail",
                                 f"{len(rest)} bytes without a newline (a write in progress or a killed writer)")
                     if rest else None)
        return bool(complete)

    def _parse(self, raw: bytes, line: int) -> None:
        text = raw.strip()
        if not text:
            return
        try:
            obj = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            self.problems.append(LineProblem(self.path, line, "corrupt_line", f"not JSON ({e})"))
            return
        why = record_problem(obj)
        if why:
            self.problems.append(LineProblem(self.path, line, "not_a_record", why))
            return
        self.records.append((line, obj))
