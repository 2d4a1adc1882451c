"""MRCR rows on disk: streaming reads, random access to one row, and the bucketing manifest.

The real set is 2,400 rows of up to ~5 MB each (about 2.3 GB of text), so nothing here holds more
than a few rows at a time. Each row's o200k_base token count, hence its bin, is computed once, in
parallel worker processes, and frozen in a manifest keyed by what identifies the data (hub id +
revision + files, or the local files' sha256). Freezing matters: since the December 2025 fix,
re-tokenising no longer gives exactly 100 rows per bin, so bins must not drift between runs.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from fp8eval.metrics.auc import bucket_of
from fp8eval.tasks.base import file_sha256
from fp8eval.tasks.mrcr.o200k import ENCODING_NAME, count_message_tokens

MANIFEST_VERSION = "1"
ROW_FIELDS = (
    "prompt", "answer", "random_string_to_prepend", "n_needles", "desired_msg_index",
    "total_messages", "n_chars", "date_added",
)


@dataclass(frozen=True)
class RowRef:
    """Where a row lives and what the manifest knows about it (everything but the text)."""

    id: str  # n_needles + sha256 of (prompt, answer): stable across file moves
    file: int  # index into the manifest's file list
    loc: tuple[int, int]  # parquet: (row group, row in group); jsonl: (byte offset, line number)
    n_needles: int
    n_tokens: int  # o200k_base, the dataset card's n_tokens(messages)
    bucket: str | None  # None: outside [4096, 1048576] (never happens in the real set)
    n_chars: int
    date_added: str
    synthetic: bool
    random_string_to_prepend: str
    answer: str  # <= 3.89k chars in the real set: kept so scoring never reopens the data
    desired_msg_index: int
    total_messages: int


def _is_parquet(path: Path) -> bool:
    return path.suffix == ".parquet"


def iter_rows(path: Path) -> Iterator[tuple[tuple[int, int], dict]]:
    """(loc, row) for each row of a parquet or JSON-lines file, one at a time."""
    if _is_parquet(path):
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        for rg in range(pf.num_row_groups):
            i = 0
            for batch in pf.iter_batches(row_groups=[rg], batch_size=4):
                for row in batch.to_pylist():
                    yield (rg, i), row
                    i += 1
        return
    with open(path, "rb") as f:
        line_no = 0
        while True:
            offset = f.tell()
            line = f.readline()
            if not line:
                return
            if line.strip():
                yield (offset, line_no), json.loads(line)
            line_no += 1


class RowReader:
    """Reads one row by its loc, holding one row in memory at a time.

    Parquet has no cheap random access to a row inside a row group, so the reader keeps a cursor:
    asking for rows in file order (the task's sample order) decodes each row once; asking for an
    earlier row restarts that group from its start.
    """

    def __init__(self, files: list[Path]):
        self.files = files
        self._cursor: tuple[int, int] | None = None  # (file, row group) the iterator walks
        self._rows: Iterator[dict] | None = None
        self._next = 0  # index in the group of the row the iterator yields next

    def read(self, ref: RowRef) -> dict:
        """The row at `ref` (a JSONL line by byte offset, or a parquet row by row group and index)."""
        path = self.files[ref.file]
        if not _is_parquet(path):
            with open(path, "rb") as f:
                f.seek(ref.loc[0])
                return json.loads(f.readline())
        rg, i = ref.loc
        if self._cursor != (ref.file, rg) or i < self._next:
            import pyarrow.parquet as pq

            batches = pq.ParquetFile(path).iter_batches(row_groups=[rg], batch_size=1)
            self._rows = (row for batch in batches for row in batch.to_pylist())
            self._cursor, self._next = (ref.file, rg), 0
        while self._next < i:
            next(self._rows)
            self._next += 1
        self._next += 1
        return next(self._rows)


def row_id(n_needles: int, prompt: str, answer: str) -> str:
    """A sample id from the needle count and the hash of prompt and answer: '<n>n-<16 hex digits>'."""
    h = hashlib.sha256()
    h.update(prompt.encode("utf-8"))
    h.update(b"\x00")
    h.update(answer.encode("utf-8"))
    return f"{n_needles}n-{h.hexdigest()[:16]}"


def _measure(prompt: str, answer: str, n_needles: int) -> tuple[str, int]:
    """Worker side: (row id, o200k tokens of the messages' contents)."""

    return row_id(n_needles, prompt, answer), count_message_tokens(json.loads(prompt))


def _measure_with(counter: Callable[[list[dict]], int]):
    def measure(prompt: str, answer: str, n_needles: int) -> tuple[str, int]:
        return row_id(n_needles, prompt, answer), counter(json.loads(prompt))

    return measure


def _ref(file_idx: int, loc, row: dict, rid: str, n_tokens: int) -> RowRef:
    return RowRef(
        id=rid,
        file=file_idx,
        loc=tuple(loc),
        n_needles=int(row["n_needles"]),
        n_tokens=n_tokens,
        bucket=bucket_of(n_tokens),
        n_chars=int(row["n_chars"]),
        date_added=str(row["date_added"]),
        synthetic=bool(row.get("synthetic", False)),
        random_string_to_prepend=str(row["random_string_to_prepend"]),
        answer=str(row["answer"]),
        desired_msg_index=int(row["desired_msg_index"]),
        total_messages=int(row["total_messages"]),
    )


def measure_files(
    files: list[Path],
    workers: int | None = None,
    counter: Callable[[list[dict]], int] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[RowRef]:
    """Token-count every row of `files`, streaming, with at most 2 rows per worker in flight.

    workers=1 or a custom counter runs in this process (tests; a counter need not be picklable).
    """
    workers = workers or os.cpu_count() or 1
    refs: list[RowRef] = []
    rows = (
        (fi, loc, row)
        for fi, path in enumerate(files)
        for loc, row in iter_rows(path)
    )

    def light(row: dict) -> dict:  # keep the metadata, drop the big string while in flight
        return {k: v for k, v in row.items() if k != "prompt"}

    if workers == 1 or counter is not None:
        measure = _measure_with(counter) if counter is not None else _measure
        for fi, loc, row in rows:
            _check_columns(files[fi], row)
            rid, n = measure(row["prompt"], row["answer"], int(row["n_needles"]))
            refs.append(_ref(fi, loc, row, rid, n))
            if progress:
                progress(len(refs))
        return refs

    # Pool.imap would read the whole input ahead into its task queue; a bounded set of futures
    # keeps peak memory at ~2 * workers rows.
    pending: dict[Any, tuple[int, tuple, dict]] = {}
    with ProcessPoolExecutor(max_workers=workers) as pool:

        def drain_one() -> None:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                fi, loc, meta = pending.pop(fut)
                rid, n = fut.result()
                refs.append(_ref(fi, loc, meta, rid, n))
                if progress:
                    progress(len(refs))

        for fi, loc, row in rows:
            _check_columns(files[fi], row)
            fut = pool.submit(_measure, row["prompt"], row["answer"], int(row["n_needles"]))
            pending[fut] = (fi, loc, light(row))
            del row
            while len(pending) >= 2 * workers:
                drain_one()
        while pending:
            drain_one()
    return sorted(refs, key=lambda r: (r.file, r.loc))  # completion order varies; files' order does not


def _check_columns(path: Path, row: dict) -> None:
    missing = [c for c in ROW_FIELDS if c not in row]
    if missing:
        raise ValueError(
            f"{path}: row lacks MRCR columns {missing}; expected the openai/mrcr schema {list(ROW_FIELDS)}"
        )


def files_sha256(files: list[Path]) -> list[str]:
    """The sha256 of each file, in order."""
    return [file_sha256(p) for p in files]


def tokenizer_identity() -> dict:
    """How the default token counts are made (o200k_base, encode_ordinary over the message contents); part of the
    manifest's key."""
    return {"encoding": ENCODING_NAME, "counted": "sum of encode_ordinary(message content)"}


def manifest_path(manifest_dir: Path, key: dict) -> Path:
    """Where the manifest of this key lives: mrcr-<hash of the key's JSON>.json in `manifest_dir`."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return manifest_dir / f"mrcr-{digest}.json"


def load_or_build_manifest(
    files: list[Path],
    key: dict,
    manifest_dir: Path,
    workers: int | None = None,
    counter: Callable[[list[dict]], int] | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> tuple[list[RowRef], Path, bool]:
    """(row refs, manifest path, built_now). `key` identifies the data (hub id + revision + file
    names, or the files' sha256); the token counter's identity and this module's version are added.
    A custom `counter` (tests) is keyed by its name so it never collides with o200k manifests."""
    full_key = {
        "manifest_version": MANIFEST_VERSION,
        "data": key,
        "tokenizer": tokenizer_identity() if counter is None else {"custom": counter.__qualname__},
    }
    path = manifest_path(manifest_dir, full_key)
    if path.is_file():
        stored = json.loads(path.read_text())
        if stored.get("key") == full_key:
            return [RowRef(**{**r, "loc": tuple(r["loc"])}) for r in stored["rows"]], path, False
        log(f"manifest {path} has a different key; rebuilding")
    log(f"bucketing {len(files)} file(s) by o200k_base tokens (once; cached in {path})")
    refs = measure_files(files, workers=workers, counter=counter)
    manifest_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": full_key, "files": [str(p) for p in files],
                               "rows": [asdict(r) for r in refs]}))
    tmp.replace(path)
    return refs, path, True
