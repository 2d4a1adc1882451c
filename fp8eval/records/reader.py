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
arm's valid records from `read_arm` / `select_arm`, so they can never disagree about what counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from fp8eval.metrics.select import DONE_STATUSES, one_per_key, record_key
from fp8eval.records.codec import FileScan, LineProblem

__all__ = ["DONE_STATUSES", "ArmRecords", "arm_files", "read_arm", "read_records", "segment_dir", "select_arm"]
Key = tuple[str, int]


class ArmRecords(NamedTuple):
    """An arm's valid records (one per (sample, repeat), in key order), counts of what was ignored by
    reason, and the lines set aside (file:line for every corrupt one)."""

    records: list[dict]
    ignored: dict[str, int]
    problems: list[LineProblem]

    def done_keys(self) -> set[Key]:
        """The (sample_id, repeat) keys that need no new request: status ok or skipped."""
        return {(r["sample_id"], r["repeat"]) for r in self.records if r["status"] in DONE_STATUSES}


def segment_dir(base: Path) -> Path:
    """Where writers other than the primary one append (`<fp[:20]>.seg/<writer>.jsonl`)."""
    return base.with_suffix(".seg")


def arm_files(base: Path) -> list[Path]:
    """The arm's files: the primary `<fp[:20]>.jsonl` and every writer segment, in a stable order."""
    seg = segment_dir(base)
    return [base, *(sorted(seg.glob("*.jsonl")) if seg.is_dir() else [])]


def select_arm(scans: Iterable[FileScan], fingerprint: str | None, task: str | None,
               expected: Mapping[Key, str | None] | None = None) -> ArmRecords:
    """Apply the exactly-once rules to scanned files. `fingerprint`/`task` None accept any value;
    `expected` maps each planned (sample, repeat) to its prompt hash (None: planned as skipped without a
    prompt); None accepts every key and prompt."""
    ignored: Counter[str] = Counter()
    problems: list[LineProblem] = []
    candidates: list[tuple[tuple, dict]] = []
    for file_index, scan in enumerate(scans):
        problems.extend(scan.problems)
        if scan.torn is not None:
            problems.append(scan.torn)
        for line, rec in scan.records:
            if fingerprint is not None and rec["arm"] != fingerprint:
                ignored["other_arm"] += 1
                continue
            if task is not None and rec["task"] != task:
                ignored["other_task"] += 1
                continue
            key = (str(rec["sample_id"]), int(rec["repeat"]))
            if expected is not None:
                if key not in expected:
                    ignored["outside_selection"] += 1
                    continue
                if rec.get("prompt_hash") != expected[key]:
                    ignored["stale_prompt"] += 1
                    continue
            candidates.append(((str(rec.get("time") or ""), file_index, line), rec))
    # Oldest first (time, then file and line: one writer's file is in write order), then the one rule of
    # fp8eval.metrics.select: the last done record wins, an error only while there is no done one.
    candidates.sort(key=lambda c: c[0])
    chosen, n_replaced = one_per_key(c[1] for c in candidates)
    if n_replaced:
        ignored["superseded"] += n_replaced
    for p in problems:
        ignored[p.reason] += 1
    records = sorted(chosen, key=record_key)
    return ArmRecords(records, dict(sorted(ignored.items())), problems)


def read_arm(path: Path, fingerprint: str | None, task: str | None,
             expected: Mapping[Key, str | None] | None = None) -> ArmRecords:
    """An arm's valid records from its primary file `path` and its writer segments (see select_arm)."""
    scans = []
    for p in arm_files(Path(path)):
        scan = FileScan(p)
        scan.advance()
        scans.append(scan)
    return select_arm(scans, fingerprint, task, expected)


def read_records(path: Path) -> list[dict]:
    """Every well-formed record line of one file in order, duplicates included (for tests and tools that
    inspect a file; counting goes through read_arm)."""
    scan = FileScan(Path(path))
    scan.advance()
    return [rec for _, rec in scan.records]
