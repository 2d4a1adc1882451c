"""The records store of one arm: append-only JSONL files keyed by the arm fingerprint, safe for several
concurrent writers on one machine or on a shared filesystem.

Files under `<root>/<task>/`:
- `<fp[:20]>.jsonl`: the primary file, written by the writer holding the `primary.writer` claim (the only
  writer, in the common case); `<fp[:20]>.arm.json`: the fingerprint material;
- `<fp[:20]>.seg/<writer>.jsonl`: one segment per further concurrent writer (never shared, so no two
  processes ever append to one file: O_APPEND is not atomic on NFS);
- `<fp[:20]>.claims/`: claim files, one per (sample, repeat) in progress (fp8eval.records.claims).

Appends are group-committed: each append is one write() (so a killed process loses only what it had not
written yet), and one fsync covers every append of the last `commit_s` seconds (or `commit_max` records);
an append after a pause of `commit_s` or more (a slow engine: nothing to group with) is fsynced at once.
A record is acknowledged -- its claim released, its key counted by `read` -- only after the fsync that
covers it: a machine crash loses at most what was not yet acknowledged, and never a line a summary counted
(`read(durable=True)` also fsyncs the other writers' files before counting). A torn last line is set aside
by the reader and cut off when its writer's file is next opened.

`python -m fp8eval.records repair` takes the arm's `arm.repair` claim (the same claims as the writers):
a writer that opens the arm while a repair holds it waits (naming the repair's host and pid), and a
repair refuses an arm with a live writer, so a repair never replaces a file a writer appends to.

Use (the runner; shards of one arm use it the same way, each process with its own ArmStore):

    store = ArmStore(root, task, fp, material).open()
    view = store.read(expected)           # ArmRecords: what counts now
    got = store.claim(keys)               # the keys this writer may do now (others are busy elsewhere)
    view = store.read(expected)           # re-read after claiming: a key may have been finished meanwhile
    store.append(records); store.release(keys_written)
    store.close()                         # releases the remaining claims
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fp8eval.core.secrets import redact_obj
from fp8eval.records.claims import Claims, RecordsIOError, claim_name, io_error  # noqa: F401 - re-exported
from fp8eval.records.codec import DEFAULT_SCORE_RANGE, encode_line
from fp8eval.records.index import IndexedScan, StaleIndex
from fp8eval.records.reader import ArmRecords, Key, Selection, arm_files, feed, segment_dir
from fp8eval.records.schema import check_record

PRIMARY = "primary.writer"
REPAIR = "arm.repair"


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
    score_range: tuple[float, float] | None = DEFAULT_SCORE_RANGE  # the task's declared score range
    commit_s: float = 0.2  # group commit: one fsync covers the appends of this long ...
    commit_max: int = 512  # ... or this many records, whichever comes first
    wait_poll_s: float = 1.0  # how often a writer looks again while a repair holds the arm
    _claims: Claims | None = field(default=None, repr=False)
    _own: Path | None = field(default=None, repr=False)
    _fd: int | None = field(default=None, repr=False)
    _pending: list = field(default_factory=list, repr=False)
    _pending_since: float = field(default=0.0, repr=False)
    _last_append: float = field(default=float("-inf"), repr=False)
    _view: tuple | None = field(default=None, repr=False)  # (expected, scans by path, Selection)
    io: dict = field(default_factory=lambda: {"appends": 0, "fsyncs": 0, "fsync_s": 0.0}, repr=False)

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
        """Create the arm's directory and meta file, register as a writer, wait while a repair holds the arm,
        and pick the file to append to. Raises RecordsIOError (one line) when the store cannot be written."""
        try:
            self._open()
        except OSError as e:
            self.close()
            raise io_error(e, "open the records of", Path(e.filename or self.path)) from None
        return self

    def _write_meta(self) -> None:
        meta = {"fingerprint": self.fingerprint, "material": self.material,
                "score_range": list(self.score_range) if self.score_range is not None else None}
        try:
            old = json.loads(self.meta_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            old = None
        except ValueError:
            old = {}
        if isinstance(old, dict) and old.get("score_range", "absent") == meta["score_range"] and "fingerprint" in old:
            return
        tmp = self.meta_path.with_name(f".{self.meta_path.name}.{os.getpid()}.tmp")
        # redacted (an `--api-key` in a managed server's extra_flags); the fingerprint is the unredacted material's
        tmp.write_text(json.dumps(redact_obj(meta), indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, self.meta_path)

    def _open(self) -> None:
        if self.path.parent.exists() and not self.path.parent.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(self.path.parent))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write_meta()
        self._claims = Claims(self.claims_dir, stale_s=self.stale_s).register()
        self._wait_for_repair()
        if self._claims.try_claim(PRIMARY):
            self._own = self.path
        else:
            seg = segment_dir(self.path)
            seg.mkdir(exist_ok=True)
            self._own = seg / f"{self._claims.writer_id}.jsonl"
        if self._own.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(self._own))
        repair_torn_tail(self._own)
        # Segments of writers that died mid-line are cut too, once nobody can still be writing them.
        for p in arm_files(self.path)[1:]:
            if p != self._own and not self._claims.writer_alive(p.stem):
                repair_torn_tail(p)
        self._fd = os.open(self._own, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._last_append = time.monotonic()

    def _wait_for_repair(self) -> None:
        """Registered first, then look: a repair either sees this writer (and refuses) or is seen here."""
        assert self._claims is not None
        said = False
        while True:
            owner = Claims._owner(self.claims_dir / REPAIR)
            if not owner or not self._claims.writer_alive(owner):
                return
            if not said:
                print(f"note: {self.path} is being repaired by `python -m fp8eval.records repair` "
                      f"({self._claims.describe(owner)}); waiting for it to finish", file=sys.stderr)
                said = True
            time.sleep(self.wait_poll_s)

    def close(self) -> None:
        """Commit what was appended, then release this writer's claims (the primary one included)."""
        try:
            if self._fd is not None:
                self.commit()
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
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
    def read(self, expected: Mapping[Key, str | None] | None = None, durable: bool = False) -> ArmRecords:
        """The arm's valid records (fp8eval.records.reader rules), `expected` = planned key -> prompt hash.
        Commits this writer's appends first; with `durable`, fsyncs every file of the arm before counting
        (so nothing counted can be lost to a crash). Incremental: only bytes appended since the last call
        with the same `expected` are parsed."""
        if self._fd is not None:
            self.commit()
        if durable:
            for p in arm_files(self.path):
                try:
                    fd = os.open(p, os.O_RDONLY)
                except FileNotFoundError:
                    continue
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        if self._view is None or self._view[0] is not expected:
            self._view = (expected, {}, Selection(self.fingerprint, self.task, expected))
        use_index = True
        while True:
            _, scans, sel = self._view
            for p in arm_files(self.path):
                if p not in scans:
                    scans[p] = IndexedScan(p, self.score_range, use_index)
            if feed(self.path, list(scans.values()), sel):
                try:
                    view = sel.result(scans.values())
                except StaleIndex:  # a file changed under its index: read every file whole
                    use_index = False
                else:
                    for scan in scans.values():
                        scan.save()
                    return view
            self._view = (expected, {}, Selection(self.fingerprint, self.task, expected))

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
        """Drop this writer's claims on `keys`. A key whose record still waits for its fsync is committed
        first (a claim is never dropped before its record is durable); the runner leaves releasing to the
        group commit instead."""
        if self._claims is not None:
            keys = list(keys)
            if self._pending and set(keys) & set(self._pending):
                self.commit()
            self._claims.release([claim_name(*k) for k in keys])

    def busy_elsewhere(self, keys: Iterable[Key]) -> list[Key]:
        """Keys whose claim a live writer other than this one holds."""
        return [k for k, _ in self.busy_owners(keys)]

    def busy_owners(self, keys: Iterable[Key]) -> list[tuple[Key, str]]:
        """(key, 'host H pid P') for each key whose claim a live writer other than this one holds."""
        assert self._claims is not None
        out = []
        for k in keys:
            owner = Claims._owner(self.claims_dir / claim_name(*k))
            if owner and owner != self._claims.writer_id and self._claims.writer_alive(owner):
                out.append((k, self._claims.describe(owner)))
        return out

    # -- writing --------------------------------------------------------------------------------------
    def append(self, records: list[dict]) -> None:
        """Validate and append records to this writer's own file (one write); their claims are released by
        the group commit whose fsync covers them (see `commit`)."""
        if not records:
            return
        lines = []
        for r in records:
            check_record(r, self.score_range)
            line, written, escaped = encode_line(r)
            if escaped:  # a completion holding a lone surrogate: written with U+FFFD, counted (record and run)
                r.clear()
                r.update(written)
                self.io["escaped_chars"] = self.io.get("escaped_chars", 0) + escaped
            lines.append(line)
        data = b"".join(lines)
        assert self._fd is not None, "ArmStore.open() first"
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as e:
            raise io_error(e, "append records to", self.own_path) from None
        self.io["appends"] += 1
        now = time.monotonic()
        # A slow stream (nothing appended for commit_s) has nothing to group with: commit at once.
        slow = now - self._last_append >= self.commit_s
        if not self._pending:
            self._pending_since = now
        self._last_append = now
        self._pending.extend((str(r["sample_id"]), int(r["repeat"])) for r in records)
        if slow or len(self._pending) >= self.commit_max or now - self._pending_since >= self.commit_s:
            self.commit()

    def io_summary(self) -> dict:
        """This writer's appends, fsyncs and seconds spent in fsync (group commit at work)."""
        return {**self.io, "fsync_s": round(self.io["fsync_s"], 3)}

    def commit(self) -> int:
        """fsync this writer's file and acknowledge (release the claims of) every record it covers; returns
        how many records it acknowledged."""
        if not self._pending or self._fd is None:
            return 0
        t0 = time.perf_counter()
        try:
            os.fsync(self._fd)
        except OSError as e:
            raise io_error(e, "fsync records to", self.own_path) from None
        self.io["fsyncs"] += 1
        self.io["fsync_s"] += time.perf_counter() - t0
        done, self._pending = self._pending, []
        if self._claims is not None:
            self._claims.release([claim_name(*k) for k in done])
        return len(done)


def iter_arm_files(root: Path) -> Iterator[Path]:
    """The primary file of every arm under a records root (the ones with an `.arm.json` beside them, so
    token counts and `repair`'s `.rejected.jsonl` files are not taken for arms)."""
    yield from (p for p in sorted(Path(root).glob("*/*.jsonl")) if p.with_suffix(".arm.json").exists())
