"""`shard=I/N`: one process does only its deterministic share of an arm's pending (sample, repeat) pairs.

A sample belongs to shard `sha256(sample id) mod N` with all its repeats (they share one prefill), so N
processes started with `shard=0/N` ... `shard=N-1/N` (by hand, or `python -m fp8eval -m
shard=0/4,1/4,2/4,3/4 hydra/launcher=submitit_slurm`) partition the work: no two shards ever write the same
key into the shared records store. A shard that finishes its share leaves a marker file next to the arm's
records (`<records>.shard-I-of-N.done`). The same command without `shard` then finds every pair recorded,
sends zero requests and writes the summary and report; if a shard is not done it refuses and names the
missing shards (`shard=0/1` does everything in one process instead).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from fp8eval.core.errors import Fp8evalError

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


class ShardError(Fp8evalError):
    """A shard spec is malformed, or shards of this arm are not done yet."""


def parse(spec: str | None) -> tuple[int, int] | None:
    """`"I/N"` -> (I, N) with 0 <= I < N; None for no sharding."""
    if spec is None or str(spec).strip() in ("", "none", "null"):
        return None
    m = _SPEC.match(str(spec))
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
        raise ShardError(f"shard={spec!r} is not I/N with 0 <= I < N (e.g. shard=0/4 ... shard=3/4; "
                         "shard=0/1 is the whole arm in one process).")
    return int(m.group(1)), int(m.group(2))


def shard_of(sample_id: str, n: int) -> int:
    """The shard (of n) a sample belongs to, the same on every machine and Python version."""
    return int.from_bytes(hashlib.sha256(str(sample_id).encode("utf-8")).digest()[:8], "big") % n


def mine(items, shard: tuple[int, int] | None, key=lambda it: it.sample.id) -> list:
    """The items of this shard (all of them without sharding)."""
    if shard is None:
        return list(items)
    i, n = shard
    return [it for it in items if shard_of(key(it), n) == i]


def marker(records_path: Path, i: int, n: int) -> Path:
    return records_path.with_name(f"{records_path.stem}.shard-{i}-of-{n}.done")


def mark_done(records_path: Path, shard: tuple[int, int], n_pairs: int) -> None:
    """Record that this shard's share of the arm is complete (written atomically, unique temp name)."""
    i, n = shard
    path = marker(records_path, i, n)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"shard": f"{i}/{n}", "pairs": n_pairs}) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def shard_counts(records_path: Path) -> dict[int, set[int]]:
    """{N: {I of the shards of N that are done}} from the marker files next to an arm's records."""
    out: dict[int, set[int]] = {}
    for p in records_path.parent.glob(f"{records_path.stem}.shard-*-of-*.done"):
        m = re.search(r"\.shard-(\d+)-of-(\d+)\.done$", p.name)
        if m:
            out.setdefault(int(m.group(2)), set()).add(int(m.group(1)))
    return out


def check_unsharded(records_path: Path, arm: str, pending_ids: list[str]) -> None:
    """An unsharded run of an arm that was sharded: refuse to do the work of shards that have not
    finished (no marker) silently in one process; name them instead. Pending pairs of finished shards
    are new work (a larger grid reuses the arm's records) and are left to this run."""
    parts, n_missing = [], 0
    for n, done in sorted(shard_counts(records_path).items()):
        todo: dict[int, int] = {}
        for sid in pending_ids:
            s = shard_of(sid, n)
            if s not in done:
                todo[s] = todo.get(s, 0) + 1
        if todo:
            n_missing = max(n_missing, sum(todo.values()))
            missing = ", ".join(f"{i}/{n} ({k} pairs)" for i, k in sorted(todo.items()))
            parts.append(f"shards done {len(done)} of {n}; not done: {missing}")
    if parts:
        raise ShardError(
            f"Arm {arm} was run in shards and {n_missing} (sample, repeat) pairs of unfinished shards are still "
            "missing: " + "; ".join(parts) + ". Run the missing shards (e.g. `python -m fp8eval ... shard=I/N`), "
            "then this command again; or pass shard=0/1 to finish them all in this one process.")
