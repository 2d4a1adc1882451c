"""The one records reader: which lines of an arm's files count, exactly once.

A record counts only when its arm fingerprint and task are the arm's, and (given the run's plan) its
(sample, repeat) is planned and its prompt hash is the planned one. Per (sample, repeat) the last done
record ("ok" or "skipped") wins; an "error" record counts only while no done record exists, so an error
retried later is never counted again. Everything else is counted in `ignored` by reason:

- `corrupt_line`: not JSON; `not_a_record`: JSON without the record fields; `torn_tail`: an unterminated
  last line (a write in progress, or a writer killed mid-write),
- `other_arm`, `other_task`: a record of another arm or task in this arm's files,
- `outside_selection`: a (sample, repeat) this run does not plan (a larger grid or more repeats wrote it),
- `stale_prompt`: its prompt hash is no longer the planned prompt's (the prompt changed: resent),
- `superseded`: an older or duplicate record of a (sample, repeat) that has a winner.

The runner (`fp8eval.runner`), `summary.json`, the report and `python -m fp8eval.records check` all get an
arm's valid records from `read_arm` / `Selection`, so they can never disagree about what counts.

Reading streams: each file is parsed block by block and only the current winner of each (sample, repeat)
is kept (with `keep=False`, only its status and position), so memory grows with the keys that count, not
with the file: a 10-sample run over an arm that a 10,000-sample grid filled keeps 10 records.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from fp8eval.metrics.select import DONE_STATUSES
from fp8eval.records.codec import DEFAULT_SCORE_RANGE, MAX_PROBLEMS, FileScan, LineProblem
from fp8eval.records.index import IndexedRecord

__all__ = ["DONE_STATUSES", "ArmRecords", "Selection", "arm_files", "arm_score_range", "read_arm", "read_records",
           "segment_dir", "select_arm"]
Key = tuple[str, int]
# Fields whose values repeat across an arm's records: kept records share one object per distinct value.
_SHARED_FIELDS = frozenset(("schema", "arm", "task", "kv", "task_version", "status", "finish_reason", "time", "groups",
                            "extracted", "skip_reason"))


class ArmRecords(NamedTuple):
    """An arm's valid records (one per (sample, repeat), in key order), counts of what was ignored by
    reason, the lines set aside (file:line, the first ones of each file), where each record that counts
    lies (path, line, byte offset, length, status), in key order, and how many count per status. A
    selection made with keep=False has no `records`, only `where` and `n_by_status`."""

    records: list[dict]
    ignored: dict[str, int]
    problems: list[LineProblem]
    where: tuple = ()
    n_by_status: dict = {}

    def done_keys(self) -> set[Key]:
        """The (sample_id, repeat) keys that need no new request: status ok or skipped."""
        return {(r["sample_id"], r["repeat"]) for r in self.records if r["status"] in DONE_STATUSES}

    def status_counts(self) -> dict[str, int]:
        """How many of the records that count are ok, error, skipped."""
        return dict(self.n_by_status)


def segment_dir(base: Path) -> Path:
    """Where writers other than the primary one append (`<fp[:20]>.seg/<writer>.jsonl`)."""
    return base.with_suffix(".seg")


def arm_files(base: Path) -> list[Path]:
    """The arm's files: the primary `<fp[:20]>.jsonl` and every writer segment, in a stable order."""
    seg = segment_dir(base)
    return [base, *(sorted(seg.glob("*.jsonl")) if seg.is_dir() else [])]


def arm_score_range(base: Path) -> tuple[float, float] | None:
    """The task's score range written in the arm's `.arm.json` (`null`: any finite score), else 0..1."""
    try:
        meta = json.loads(Path(base).with_suffix(".arm.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return DEFAULT_SCORE_RANGE
    if not isinstance(meta, dict) or "score_range" not in meta:
        return DEFAULT_SCORE_RANGE
    rng = meta["score_range"]
    if rng is None:
        return None
    try:
        lo, hi = (float(x) for x in rng)
        return (lo, hi)
    except (TypeError, ValueError):
        return DEFAULT_SCORE_RANGE


def _file_rank(base: Path, path: Path) -> tuple[int, str]:
    """Tie-break between files (after a record's time): the primary file first, then segments by name;
    the same for every reader however it found the files."""
    return (0, "") if path == base else (1, path.name)


def _matches(fp: str, arm: str) -> bool:
    # A 64-hex fingerprint must match exactly; a shorter one (the file name's fp[:20], when the .arm.json
    # is missing) is a prefix.
    return arm == fp if len(fp) >= 64 else arm.startswith(fp)


class Selection:
    """The exactly-once rules applied while streaming: feed records with `add`, get the ArmRecords with
    `result`. `fingerprint`/`task` None accept any value (a fingerprint shorter than 64 characters is a
    prefix); `expected` maps each planned (sample, repeat) to its prompt hash (None: planned as skipped
    without a prompt), None accepts every key and prompt; `keep=False` keeps only each winner's identity,
    status and position (for `check` and `repair` of arms of any size); `drop` names fields not kept (the
    report leaves out the completion texts)."""

    def __init__(self, fingerprint: str | None, task: str | None,
                 expected: Mapping[Key, str | None] | None = None, keep: bool = True, drop: tuple = (),
                 notes: bool = False):
        self.fingerprint, self.task, self.expected, self.keep, self.drop = fingerprint, task, expected, keep, drop
        self.ignored: Counter[str] = Counter()
        # notes=True (records check): each line that does not count, with its file:line (the first MAX_PROBLEMS)
        self.notes: list[LineProblem] | None = [] if notes else None
        self.n_candidates = 0
        self.done: dict[Key, tuple] = {}
        self.err: dict[Key, tuple] = {}
        self._shared: dict = {}  # value -> the one object kept records share (_compact)

    def add(self, rank: tuple[int, str], path: Path, line: int, rec: dict, pos: int = 0, length: int = 0) -> None:
        """One valid record line of file `path` (ranked by _file_rank)."""
        if self.fingerprint is not None and not _matches(self.fingerprint, rec["arm"]):
            return self._ignore("other_arm", path, line, f"arm {rec['arm'][:20]}, not {self.fingerprint[:20]}")
        if self.task is not None and rec["task"] != self.task:
            return self._ignore("other_task", path, line, f"task {rec['task']!r}, not {self.task!r}")
        key = (str(rec["sample_id"]), int(rec["repeat"]))
        if self.expected is not None:
            if key not in self.expected:
                return self._ignore("outside_selection", path, line, f"{key} is not planned")
            if rec.get("prompt_hash") != self.expected[key]:
                return self._ignore("stale_prompt", path, line, f"{key} was asked with another prompt")
        self.n_candidates += 1
        # The one rule of fp8eval.metrics.select, in file order (time, then file, then line): the last
        # done record wins, an error only while there is no done one.
        order = (sys.intern(str(rec.get("time") or "")), rank, line)
        if rec["status"] in DONE_STATUSES:
            slot, other = self.done, self.err
        else:
            if key in self.done:
                return self._note("superseded", path, line, f"{key}: an error after its done record")
            slot, other = self.err, None
        cur = slot.get(key)
        if self.notes is not None and cur is not None:  # one of the two lines loses
            lost = cur[1] if order > cur[0] else (path, line)
            self._note("superseded", lost[0], lost[1], f"{key}: a later {rec['status']} record of it counts"
                       if order > cur[0] else f"{key}: an earlier or duplicate record")
        if self.notes is not None and other is not None and key in other:
            self._note("superseded", other[key][1][0], other[key][1][1], f"{key}: an error before its done record")
        if cur is None or order > cur[0]:
            if self.keep and type(rec) is not IndexedRecord:  # an index's stub: its line is read in result()
                rec = self._compact(rec)
            slot[key] = (order, (path, line, pos, length, rec["status"]), rec if self.keep else None)
        if other is not None:
            other.pop(key, None)

    def _note(self, reason: str, path: Path, line: int, detail: str) -> None:
        if self.notes is not None and len(self.notes) < MAX_PROBLEMS:
            self.notes.append(LineProblem(path, line, reason, detail))

    def _ignore(self, reason: str, path: Path, line: int, detail: str) -> None:
        self.ignored[reason] += 1
        self._note(reason, path, line, detail)

    def _compact(self, rec: dict) -> dict:
        """A kept record without the `drop` fields, its values that repeat across records (arm, task, status,
        groups, ...) shared with the records kept before it: a large arm's records take a fraction of the memory."""
        shared = self._shared
        out = {}
        for k, v in rec.items():
            if k in self.drop:
                continue
            if k in _SHARED_FIELDS:
                if type(v) is str:
                    v = shared.setdefault(v, v)
                elif type(v) is list:  # groups: one list object per distinct value (never modified in place)
                    v = shared.setdefault(("list", *v), v)
            out[k] = v
        return out

    def result(self, scans: Iterable[FileScan] = ()) -> ArmRecords:
        """The winners in key order, with what was ignored (the scans' set-aside lines included); a winner
        that came from a file's index is read from its line here (fp8eval.records.index.StaleIndex when that
        line is not the record the index describes)."""
        if self.keep:
            for slot in (self.done, self.err):
                for key, (order, where, rec) in list(slot.items()):
                    if type(rec) is IndexedRecord:
                        slot[key] = (order, where, self._compact(rec.scan.load(rec, where)))
        ignored = Counter(self.ignored)
        problems: list[LineProblem] = list(self.notes or [])
        for scan in scans:
            problems.extend(scan.problems)
            if scan.torn is not None:
                problems.append(scan.torn)
                ignored["torn_tail"] += 1
            ignored.update(scan.counts)
        chosen = {**self.err, **self.done}
        if self.n_candidates > len(chosen):
            ignored["superseded"] += self.n_candidates - len(chosen)
        keys = sorted(chosen)
        items = [chosen[k] for k in keys]
        return ArmRecords([c[2] for c in items] if self.keep else [],
                          dict(sorted((k, v) for k, v in ignored.items() if v)), problems,
                          tuple(c[1] for c in items), dict(Counter(c[1][4] for c in items)))


def feed(base: Path, scans: list[FileScan], selection: Selection) -> bool:
    """Advance every scan into `selection`; False when a file was replaced meanwhile (start over)."""
    for scan in scans:
        rank = _file_rank(base, scan.path)
        got = scan.advance(lambda line, rec, pos, n, r=rank, p=scan.path: selection.add(r, p, line, rec, pos, n))
        if got == "reset":
            return False
    return True


def select_arm(scans: Iterable[FileScan], fingerprint: str | None, task: str | None,
               expected: Mapping[Key, str | None] | None = None) -> ArmRecords:
    """Apply the exactly-once rules to fresh (not yet advanced) scans of one arm, the first being its primary
    file (see Selection)."""
    scans = list(scans)
    base = scans[0].path if scans else Path()
    while True:
        sel = Selection(fingerprint, task, expected)
        if feed(base, scans, sel):
            return sel.result(scans)
        for s in scans:
            s.reset()


def read_arm(path: Path, fingerprint: str | None, task: str | None,
             expected: Mapping[Key, str | None] | None = None, *, keep: bool = True,
             score_range: Any = "arm", drop: tuple = (), notes: bool = False) -> ArmRecords:
    """An arm's valid records from its primary file `path` and its writer segments (see Selection);
    scores are checked against `score_range` ("arm": the one in the arm's .arm.json); `drop`: fields left out."""
    base = Path(path)
    rng = arm_score_range(base) if score_range == "arm" else score_range
    while True:
        scans = [FileScan(p, rng) for p in arm_files(base)]
        sel = Selection(fingerprint, task, expected, keep, drop, notes)
        if feed(base, scans, sel):
            return sel.result(scans)


def read_records(path: Path) -> list[dict]:
    """Every well-formed record line of one file in order, duplicates included (for tests and tools that
    inspect a file; counting goes through read_arm)."""
    out: list[dict] = []
    FileScan(Path(path), None).advance(lambda line, rec, pos, n: out.append(rec))
    return out
