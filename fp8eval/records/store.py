"""The records store of one arm: append-only JSONL files keyed by the arm fingerprint, safe for several
concurrent writers on one machine or on a shared filesystem.

Files under `<root>/<task>/`:
- `<fp[:20]>.jsonl`: the primary file, written by the writer holding the `primary.writer` claim (the only
  writer, in the common case); `<fp[:20]>.arm.json`: the fingerprint material;
- `<fp[:20]>.seg/<writer>.jsonl`: one segment per further concurrent writer (never shared, so no two
  processes ever append to one file: O_APPEND is not atomic on NFS);
- `<fp[:20]>.claims/`: claim files, one per (sample, repeat) in progress (fp8eval.records.claims).

Each append is one write and one fsync, so a run killed with SIGKILL loses at most the requests in flight;
a torn last line is set aside by the reader and cut off when its writer's file is next opened.

Use (the runner; shards of one arm use it the same way, each process with its own ArmStore):

    store = ArmStore(root, task, fp, material).open()
    view = store.read(expected)           # ArmRecords: what counts now
    got = store.claim(keys)               # the keys this writer may do now (others are busy elsewhere)
    view = store.read(expected)           # re-read after claiming: a key may have been finished meanwhile
    store.append(records); store.release(keys_written)
    store.close()                         # releases the remaining claims
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fp8eval.records.claims import Claims, claim_name
from fp8eval.records.codec import FileScan, canonical_json
from fp8eval.records.reader import ArmRecords, Key, arm_files, segment_dir, select_arm

PRIMARY = "primary.writer"


def repair_torn_tail(path: Path) -> int:
    """Cut an unterminated last line (a killed writer's) off a file this writer owns; bytes removed."""
    if not path.exists() or path.stat().st_size == 0:
        return 0
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return 0
        size = f.seek(0, os.SEEK_END)
        # Search backwards in blocks: the files can be large.
        pos, cut = size, 0
        while pos > 0:
            step = min(1 << 16, pos)
            pos -= step
            f.seek(pos)
            i = f.read(step).rfind(b"\n")
            if i >= 0:
                cut = pos + i + 1
                break
        f.truncate(cut)
        os.fsync(f.fileno())
        return size - cut


@dataclass
class ArmStore:
    """The records of one arm: `<root>/<task>/<fingerprint[:20]>.jsonl`, its segments and claims."""

    root: Path
    task: str
    fingerprint: str
    material: dict
    stale_s: float = 600.0  # a claim of a writer on another host is stale after this long without heartbeat
    _claims: Claims | None = field(default=None, repr=False)
    _own: Path | None = field(default=None, repr=False)
    _scans: dict[Path, FileScan] = field(default_factory=dict, repr=False)

    @property
    def path(self) -> Path:
        """The arm's primary records file: <root>/<task>/<fingerprint[:20]>.jsonl."""
        return Path(self.root) / self.task / f"{self.fingerprint[:20]}.jsonl"

    @property
    def meta_path(self) -> Path:
        """The arm's .arm.json beside its records (fingerprint and its material)."""
        return self.path.with_suffix(".arm.json")

    @property
    def claims_dir(self) -> Path:
        """The folder of the arm's claims (which writer is doing which key)."""
        return self.path.with_suffix(".claims")

    @property
    def own_path(self) -> Path:
        """The file this writer appends to (the primary file, or its own segment)."""
        if self._own is None:
            raise RuntimeError("ArmStore.open() first")
        return self._own

    def open(self) -> ArmStore:
        """Create the arm's directory and meta file, register as a writer and pick the file to append to."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.meta_path.exists():
            tmp = self.meta_path.with_name(f".{self.meta_path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"fingerprint": self.fingerprint, "material": self.material}, indent=2,
                                      sort_keys=True, default=str) + "\n", encoding="utf-8")
            os.replace(tmp, self.meta_path)
        self._claims = Claims(self.claims_dir, stale_s=self.stale_s).register()
        if self._claims.try_claim(PRIMARY):
            self._own = self.path
        else:
            seg = segment_dir(self.path)
            seg.mkdir(exist_ok=True)
            self._own = seg / f"{self._claims.writer_id}.jsonl"
        repair_torn_tail(self._own)
        # Segments of writers that died mid-line are cut too, once nobody can still be writing them.
        for p in arm_files(self.path)[1:]:
            if p != self._own and not self._claims.writer_alive(p.stem):
                repair_torn_tail(p)
        return self

    def close(self) -> None:
        """Release this writer's claims (the primary one included)."""
        if self._claims is not None:
            self._claims.close()
            self._claims = None

    def __enter__(self) -> ArmStore:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def writer_id(self) -> str:
        """This writer's id among the arm's claims ('' before open())."""
        return self._claims.writer_id if self._claims else ""

    # -- reading --------------------------------------------------------------------------------------
    def scans(self) -> list[FileScan]:
        """Every file of the arm, read up to its current end (only new bytes since the last call)."""
        out = []
        for p in arm_files(self.path):
            scan = self._scans.get(p)
            if scan is None:
                scan = self._scans[p] = FileScan(p)
            scan.advance()
            out.append(scan)
        return out

    def read(self, expected: Mapping[Key, str | None] | None = None) -> ArmRecords:
        """The arm's valid records (fp8eval.records.reader rules), `expected` = planned key -> prompt hash."""
        return select_arm(self.scans(), self.fingerprint, self.task, expected)

    def records(self) -> list[dict]:
        """Valid records of every key (no plan given)."""
        return self.read().records

    def done_keys(self) -> set[Key]:
        """The keys with a done record (ok or skipped) in any of the arm's files."""
        return self.read().done_keys()

    # -- claims ---------------------------------------------------------------------------------------
    def claim(self, keys: Iterable[Key]) -> list[Key]:
        """Claim what no other live writer is doing; returns the keys claimed, in order."""
        assert self._claims is not None, "ArmStore.open() first"
        return [k for k in keys if self._claims.try_claim(claim_name(*k))]

    def release(self, keys: Iterable[Key]) -> None:
        """Drop this writer's claims on `keys` (call once their records are written)."""
        if self._claims is not None:
            self._claims.release([claim_name(*k) for k in keys])

    def busy_elsewhere(self, keys: Iterable[Key]) -> list[Key]:
        """Keys whose claim a live writer other than this one holds."""
        assert self._claims is not None
        out = []
        for k in keys:
            path = self.claims_dir / claim_name(*k)
            owner = Claims._owner(path)
            if owner and owner != self._claims.writer_id and self._claims.writer_alive(owner):
                out.append(k)
        return out

    # -- writing --------------------------------------------------------------------------------------
    def append(self, records: list[dict]) -> None:
        """Append records to this writer's own file: one write, one fsync."""
        if not records:
            return
        text = "".join(canonical_json(r) + "\n" for r in records)
        with open(self.own_path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def iter_arm_files(root: Path) -> Iterator[Path]:
    """The primary file of every arm under a records root (the ones with an `.arm.json` beside them, so
    token counts and `repair`'s `.rejected.jsonl` files are not taken for arms)."""
    yield from (p for p in sorted(Path(root).glob("*/*.jsonl")) if p.with_suffix(".arm.json").exists())
