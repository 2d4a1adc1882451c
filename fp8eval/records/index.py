"""A validated index of an arm file's record lines, so that a rerun parses only the bytes appended since.

`<file>.index` (next to `<fp[:20]>.jsonl` or a writer segment) holds, for the first `end` bytes of the file
(complete lines only): the SHA-256 of those bytes, the line count, the set-aside counts and first problems,
and for every valid record line its selection fields (arm, task, sample_id, repeat, prompt hash, status,
time) and position (line, byte offset, length). It is used only when the file's first `end` bytes hash to
the same digest (a truncated, rewritten or replaced file does not: it is read whole again), its own body
hashes to the digest written after it, and it was made under the same rules (this index version and the
same code that parses and validates lines: `rules()`) with the same score range;
anything else, or an index that cannot be read, falls back to the full scan. The lines after `end` (a torn
tail included) are parsed as always. The records that a selection keeps (the run's winners) are read from
their lines and validated again, so counting and the kept records are exactly those of a full scan.

`ArmStore.read` (the runner) uses it and writes it after a read that parsed `MIN_NEW_BYTES` or more;
`python -m fp8eval.records check` never does: it reads every line. The index is a cache: one that cannot
be written (a read-only records directory) changes nothing but speed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from fp8eval.records.codec import BLOCK, DEFAULT_SCORE_RANGE, FileScan, LineProblem
from fp8eval.records.schema import record_problem

INDEX_VERSION = 1
_RULES: list[str] = []  # the digest of the code that classifies lines (see rules()), computed once
# An index is written after a read that parsed at least this many bytes not covered by the one on disk.
MIN_NEW_BYTES = 8 << 20
_FIELDS = ("arm", "task", "sample_id", "repeat", "prompt_hash", "status", "time")


def rules() -> str:
    """This index version and a digest of the modules that parse and validate lines (codec, schema, this one):
    an index made under other rules (another release, a changed validation) is never trusted."""
    if not _RULES:
        h = hashlib.sha256(str(INDEX_VERSION).encode())
        try:
            for name in (FileScan.__module__, record_problem.__module__, __name__):
                mod = sys.modules[name]
                h.update(Path(mod.__file__).read_bytes())
        except (OSError, TypeError, KeyError):
            h.update(os.urandom(16))  # sources not readable: no index is ever trusted
        _RULES.append(h.hexdigest()[:20])
    return _RULES[0]


class StaleIndex(Exception):
    """A line the index points at is not the record it describes (the file changed since it was hashed)."""


class IndexedRecord(dict):
    """A record line's selection fields taken from the index; `scan.load` reads and validates the whole line."""

    __slots__ = ("scan",)


def index_path(path: Path) -> Path:
    """Where the index of an arm file lies: `<file>.index` (not a `*.jsonl`, so never taken for records)."""
    return path.with_name(path.name + ".index")


class IndexedScan(FileScan):
    """A FileScan that starts from the file's validated index (when `use_index`) and can write one."""

    def __init__(self, path: Path, score_range: tuple[float, float] | None = DEFAULT_SCORE_RANGE,
                 use_index: bool = True):
        super().__init__(path, score_range)
        self.use_index = use_index
        self.indexed_end = 0  # bytes covered by the index on disk (0: none used)
        # The index's columns (arm, task, status, time as positions in `_values`) and the rows parsed since:
        # together, the selection fields and position of every record line in [0, offset).
        self._values: list = []
        self._cols: list[list] = [[] for _ in range(len(_FIELDS) + 3)]
        self._rows: list[tuple] = []
        self._shared: dict = {}

    def reset(self) -> None:
        """Forget what was read, the index's part included."""
        super().reset()
        self.hasher, self.indexed_end, self._rows = None, 0, []
        self._values, self._cols = [], [[] for _ in range(len(_FIELDS) + 3)]

    def advance(self, emit) -> bool | str:
        """As FileScan.advance; a first call starts from the index's records when it is valid."""
        loaded = False
        if self.hasher is None:
            self.hasher = hashlib.sha256()
            loaded = self.use_index and self._load(emit)
        rows, share = self._rows, self._shared.setdefault

        def keep(line, rec, pos, n):
            t = rec.get("time")
            rows.append((share(rec["arm"], rec["arm"]), share(rec["task"], rec["task"]), rec["sample_id"],
                         rec["repeat"], rec.get("prompt_hash"), share(rec["status"], rec["status"]),
                         share(t, t) if type(t) is str else t, line, pos, n))
            emit(line, rec, pos, n)

        got = super().advance(keep)
        return got if got == "reset" else (got or loaded)

    # -- reading an index -----------------------------------------------------------------------------
    def _load(self, emit) -> bool:
        doc = self._read_doc()
        if doc is None:
            return False
        try:
            f = open(self.path, "rb")
        except OSError:
            return False
        with f:
            st = os.fstat(f.fileno())
            end = doc["end"]
            if st.st_size < end:
                return False
            hasher, left = hashlib.sha256(), end
            while left:
                block = f.read(min(BLOCK, left))
                if not block:
                    return False
                hasher.update(block)
                left -= len(block)
            if hasher.hexdigest() != doc["sha256"]:
                return False
        try:
            values, cols = doc["values"], doc["cols"]
            problems = [LineProblem(self.path, int(ln), str(why), str(detail)) for ln, why, detail in doc["problems"]]
            counts = {str(k): int(v) for k, v in doc["counts"].items()}
            line_no = int(doc["lines"])
            if (type(values) is not list or type(cols) is not list or len(cols) != len(_FIELDS) + 3
                    or any(type(c) is not list or len(c) != len(cols[0]) for c in cols)):
                return False
            for c in (cols[0], cols[1], cols[5], cols[6]):  # arm, task, status, time: positions in values
                if c and not (min(c) >= 0 and max(c) < len(values)):
                    return False
        except (KeyError, TypeError, ValueError, AttributeError):
            return False
        self.hasher, self.offset, self.line_no, self.ident = hasher, end, line_no, (st.st_dev, st.st_ino)
        self.counts, self.problems, self.indexed_end = counts, problems, end
        self._values, self._cols = values, cols
        v = values
        for arm, task, sid, rep, ph, status, t, line, pos, n in zip(*cols):
            rec = IndexedRecord(arm=v[arm], task=v[task], sample_id=sid, repeat=rep, prompt_hash=ph, status=v[status],
                                time=v[t])
            rec.scan = self
            emit(line, rec, pos, n)
        return True

    def _read_doc(self) -> dict | None:
        """The index's body when it is whole (its digest matches) and of this version and score range."""
        try:
            raw = index_path(self.path).read_bytes()
        except OSError:
            return None
        body, _, digest = raw.rstrip(b"\n").rpartition(b"\n")
        if hashlib.sha256(body).hexdigest().encode() != digest:
            return None
        try:
            doc = json.loads(body)
        except ValueError:
            return None
        rng = list(self.score_range) if self.score_range is not None else None
        if (type(doc) is not dict or doc.get("rules") != rules() or doc.get("score_range") != rng
                or type(doc.get("end")) is not int or doc["end"] < 0 or type(doc.get("sha256")) is not str):
            return None
        return doc

    def load(self, stub: IndexedRecord, where: tuple) -> dict:
        """The whole record at `where` (path, line, pos, length, status), validated as a full scan does;
        StaleIndex when the file was replaced or the line is not the record the index describes (its
        selection fields differ: the file changed in place since its digest was checked)."""
        _, line, pos, n, _ = where
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if (st.st_dev, st.st_ino) != self.ident:
                    raise StaleIndex(f"{self.path} was replaced since its index was checked")
                f.seek(pos)
                raw = f.read(n)
        except OSError as e:
            raise StaleIndex(f"{self.path}: {e}") from None
        got: list[dict] = []
        FileScan(self.path, self.score_range)._parse(raw, line, pos, lambda *a: got.append(a[1]))
        if len(raw) != n or not got or any(got[0].get(k) != stub[k] for k in _FIELDS):
            raise StaleIndex(f"{self.path}:{line} is not the record its index describes")
        return got[0]

    # -- writing an index -----------------------------------------------------------------------------
    def save(self, min_new: int | None = None) -> bool:
        """Write the index of the bytes read so far when at least `min_new` (default MIN_NEW_BYTES) of them
        are not covered by the one on disk; False when not written (nothing to gain, or the directory is not
        writable: the index is a cache)."""
        if self.hasher is None or self.offset - self.indexed_end < (MIN_NEW_BYTES if min_new is None else min_new):
            return False
        values, cols = list(self._values), [list(c) for c in self._cols]
        pos_of = {v: i for i, v in enumerate(values)}
        for k, new in enumerate(zip(*self._rows) if self._rows else ()):
            if k in (0, 1, 5, 6):  # arm, task, status, time: their position in values
                for x in set(new) - pos_of.keys():
                    pos_of[x] = len(values)
                    values.append(x)
                new = [pos_of[x] for x in new]
            cols[k].extend(new)
        doc = {"rules": rules(), "score_range": list(self.score_range) if self.score_range is not None
               else None, "end": self.offset, "lines": self.line_no, "sha256": self.hasher.hexdigest(),
               "counts": self.counts, "problems": [[p.line, p.reason, p.detail] for p in self.problems],
               "fields": [*_FIELDS, "line", "pos", "length"], "values": values, "cols": cols}
        body = json.dumps(doc, separators=(",", ":")).encode()
        target = index_path(self.path)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(body + b"\n" + hashlib.sha256(body).hexdigest().encode() + b"\n")
            os.replace(tmp, target)
        except OSError:
            try:
                tmp.unlink()
            except OSError:
                pass
            return False
        self.indexed_end, self._values, self._cols, self._rows = self.offset, values, cols, []
        return True
