"""Record lines: canonical JSON, fingerprints, and a scanner that never stops at a bad line.

A line that is not JSON, or JSON that is not a record, is a `LineProblem` naming its file and line; the
scan goes on, so one torn or hand-edited line can never block a run or hide the records after it.
"""

from __future__ import annotations

import json
import json.scanner
import os
import re
from dataclasses import dataclass
from pathlib import Path

from fp8eval.core.hashing import canonical_json, fingerprint_hash  # noqa: F401 - re-exported
from fp8eval.records.schema import (  # noqa: F401 - re-exported
    DEFAULT_SCORE_RANGE,
    RECORD_SCHEMA,
    REQUIRED_FIELDS,
    STATUSES,
    SUPPORTED_SCHEMAS,
    record_problem,
)

try:  # the fast decoder; json (below) decides every line it refuses or might read otherwise (_fast)
    import orjson
except ImportError:  # pragma: no cover - depends on the install
    orjson = None

_decode = json.JSONDecoder().decode
# The C scanner behind json.loads, called directly on a line that starts with "{": no whitespace regex around it.
# A line it cannot take whole (leading or trailing whitespace, or not JSON) goes through _decode, which says why.
_scan_once = json.scanner.make_scanner(json.JSONDecoder())
_WS_BYTES, _WS = b" \t\n\r\x0b\x0c", " \t\n\r\x0b\x0c"
# Lines set aside are all counted; at most this many per file are kept to be shown (memory stays bounded).
MAX_PROBLEMS = 200
# Bytes read at a time: memory does not grow with the file. 64 KB, below glibc's mmap threshold: 1 MB buffers
# were mapped and unmapped for every block (a 202 MB arm: 148,000 page faults and 0.44 s of system time against
# 15,000 and 0.10 s; `records check`, 2026-12-03). A line longer than a block is read in steps that grow with it.
BLOCK = 1 << 16
# orjson reads an integer literal beyond 64 bits as a float (json: an int); any float this large goes to json.
_BIG = 9.2e18


def _plain(obj: dict) -> bool:
    """True when orjson's value equals json's for this parse: no float of integer size anywhere in it (orjson
    refuses NaN, Infinity, 1e400 and lone surrogates outright, so those reach json anyway). Three levels are
    walked inline (the reader's hot loop: a record's fields, its lists and dicts, and theirs), deeper ones by
    recursion."""
    for v in obj.values():
        t = type(v)
        if t is float:
            if not -_BIG < v < _BIG:
                return False
        elif t is dict or t is list:
            for x in (v.values() if t is dict else v):
                t = type(x)
                if t is float:
                    if not -_BIG < x < _BIG:
                        return False
                elif t is dict or t is list:
                    for y in (x.values() if t is dict else x):
                        t = type(y)
                        if t is float:
                            if not -_BIG < y < _BIG:
                                return False
                        elif (t is dict or t is list) and not _plain({0: y}):
                            return False
    return True


def _fast(text):
    """orjson's value of one line when it is exactly json's, else None (json then parses the line)."""
    try:
        obj = orjson.loads(text)
    except ValueError:
        return None
    return obj if type(obj) is dict and _plain(obj) else None


_SURROGATE = re.compile("[\ud800-\udfff]")


def escape_unencodable(obj):
    """`obj` (a JSON-like tree) with every character UTF-8 cannot carry (a lone surrogate, valid in JSON text as
    `"\\ud800"`, invalid in UTF-8) replaced by U+FFFD, and how many were replaced."""
    if isinstance(obj, str):
        return _SURROGATE.subn("\ufffd", obj)
    if isinstance(obj, dict):
        out, n = {}, 0
        for k, v in obj.items():
            (k, a), (v, b) = escape_unencodable(k), escape_unencodable(v)
            out[k], n = v, n + a + b
        return out, n
    if isinstance(obj, (list, tuple)):
        items = [escape_unencodable(v) for v in obj]
        return [v for v, _ in items], sum(n for _, n in items)
    return obj, 0


def encode_line(record: dict) -> tuple[bytes, dict, int]:
    """A record's line (canonical JSON, UTF-8, newline); characters UTF-8 cannot carry are replaced by U+FFFD
    and counted in the record's `escaped_chars`. Returns (line, the record written, characters replaced)."""
    text = canonical_json(record)
    try:
        return (text + "\n").encode("utf-8"), record, 0
    except UnicodeEncodeError:
        clean, n = escape_unencodable(record)
        clean["escaped_chars"] = int(record.get("escaped_chars") or 0) + n
        return (canonical_json(clean) + "\n").encode("utf-8"), clean, n


def _carried(obj):
    """A parsed line with every lone surrogate replaced by U+FFFD and counted in its `escaped_chars` (a line
    written by hand or by another tool: ours never holds one), so nothing downstream fails to encode it."""
    if type(obj) is not dict:
        return obj
    clean, n = escape_unencodable(obj)
    if not n:
        return obj
    clean["escaped_chars"] = int(obj.get("escaped_chars") or 0) + n if type(obj.get("escaped_chars", 0)) is int else n
    return clean


@dataclass
class LineProblem:
    """A line set aside: where it is and why (`corrupt_line`, `not_a_record`, `torn_tail`)."""

    path: Path
    line: int
    reason: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}: {self.detail}"


class FileScan:
    """Incremental, streaming reader of one append-only JSONL file: `advance(emit)` parses only the bytes
    appended since the last call, block by block, and hands each valid record to `emit(line, record, pos,
    length)` without keeping it, so memory does not grow with the file. Lines that are not records are
    counted by reason in `counts` (the first MAX_PROBLEMS kept in `problems` to be shown). A file replaced
    (another inode, as `repair` does) or shortened is read again from the start: `advance` then returns
    "reset" and the caller starts its selection over."""

    def __init__(self, path: Path, score_range: tuple[float, float] | None = DEFAULT_SCORE_RANGE):
        self.path = Path(path)
        self.score_range = score_range
        self.offset = 0
        self.line_no = 0
        self.ident: tuple[int, int] | None = None
        self.problems: list[LineProblem] = []
        self.counts: dict[str, int] = {}
        self.torn: LineProblem | None = None  # an unterminated last line: a write in progress or a killed writer
        self.hasher = None  # a hashlib object to feed every complete line read (fp8eval.records.index sets one)

    def reset(self) -> None:
        """Forget what was read (the next advance reads the file from its start)."""
        self.offset, self.line_no, self.ident, self.problems, self.counts, self.torn = 0, 0, None, [], {}, None

    def _problem(self, line: int, reason: str, detail: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(LineProblem(self.path, line, reason, detail))

    def advance(self, emit) -> bool | str:
        """Read what was appended; True when anything new was parsed, "reset" when the file was replaced or
        shortened (the caller must forget what this file gave it; nothing is read then)."""
        try:
            f = open(self.path, "rb")
        except (FileNotFoundError, NotADirectoryError):
            return False
        with f:
            st = os.fstat(f.fileno())
            ident = (st.st_dev, st.st_ino)
            if self.ident is not None and (ident != self.ident or st.st_size < self.offset):
                self.reset()
                return "reset"
            self.ident = ident
            size = st.st_size
            if size == self.offset:
                return False
            f.seek(self.offset)
            pos, carry, any_new = self.offset, b"", False
            while pos < size:
                block = f.read(min(max(BLOCK, len(carry)), size - pos))
                if not block:
                    break
                pos += len(block)
                data = carry + block
                cut = data.rfind(b"\n") + 1
                if not cut:
                    carry = data
                    continue
                start = pos_line = self.offset
                carry = data[cut:]
                if self.hasher is not None:
                    self.hasher.update(memoryview(data)[:cut])
                # An ASCII block (the writer's JSON is ASCII-escaped) is decoded once: characters are bytes.
                # No copy of the block is made, and each buffer is let go as soon as the next one exists.
                if data.isascii():
                    text = str(memoryview(data)[:cut], "ascii")
                    block = data = None
                    lines, text = text.split("\n"), None
                else:
                    lines = memoryview(data)[:cut].tobytes().split(b"\n")
                    block = data = None
                lines.pop()  # the empty piece after the last newline
                parse = self._parse
                for raw in lines:
                    self.line_no += 1
                    parse(raw, self.line_no, pos_line, emit)
                    pos_line += len(raw) + 1
                lines = None
                self.offset = start + cut
                any_new = True
            self.torn = (LineProblem(self.path, self.line_no + 1, "torn_tail",
                                     f"{len(carry)} bytes without a newline (a write in progress or a killed writer)")
                         if carry else None)
        return any_new

    def _parse(self, raw: bytes | str, line: int, pos: int, emit) -> None:
        """One line (bytes, or str from an ASCII block) into `emit`, or counted as a problem."""
        obj = None
        if raw[:1] in (b"{", "{"):  # the writer's lines: one JSON object, nothing around it
            obj = _fast(raw) if orjson is not None else None
            if obj is None:
                try:
                    text = raw if type(raw) is str else raw.decode("utf-8")
                    obj, end = _scan_once(text, 0)
                    if end != len(text):
                        obj = None
                except (UnicodeDecodeError, ValueError, StopIteration, RecursionError):
                    obj = None
        if obj is None:
            text = raw.strip(_WS if type(raw) is str else _WS_BYTES)  # ASCII whitespace, as bytes.strip()
            if not text:
                return
            try:
                obj = _decode(text if type(text) is str else text.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                self._problem(line, "corrupt_line", f"not JSON ({e})")
                return
            except RecursionError:  # json's decoder recurses once per level: a hostile line cannot stop a reader
                self._problem(line, "corrupt_line", "not JSON (nested too deeply to read)")
                return
        if (b"\\ud" in raw or b"\\uD" in raw) if type(raw) is bytes else ("\\ud" in raw or "\\uD" in raw):
            obj = _carried(obj)  # a lone surrogate escaped in the line: U+FFFD, counted in the record
        try:
            why = record_problem(obj, self.score_range)
        except RecursionError:
            why = "nested too deeply to read"
        if why:
            self._problem(line, "not_a_record", why)
            return
        emit(line, obj, pos, len(raw))
