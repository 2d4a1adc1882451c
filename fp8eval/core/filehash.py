"""sha256 of data files, remembered by (path, size, mtime, inode) so a big file is hashed once.

Fingerprints and the MRCR manifest key name local data by content, which is right (a moved file keeps
its records, an edited one never reuses them) but costs a full read each run: 5.9 s for MRCR's 2 GB.
Like git's index, a file whose path, size, modification time and inode are unchanged is taken to
have the same content. Files under 1 MiB are simply hashed (cheaper than a cache line).

The memo is `$FP8EVAL_CACHE/file-sha256.jsonl` (default ~/.cache/fp8eval), one line per file
version, appended with one write each; unreadable lines are ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from fp8eval.core.paths import cache_root

SMALL = 1 << 20
RACY_S = 1.0  # well above the timestamp granularity of Linux file systems (a clock tick)
_memo: dict[str, str] | None = None


def _memo_path() -> Path:
    return cache_root() / "file-sha256.jsonl"


def _load() -> dict[str, str]:
    global _memo
    if _memo is None:
        _memo = {}
        try:
            with open(_memo_path(), "r", encoding="utf-8") as f:
                for line in f:
                    try:
                        row = json.loads(line)
                        _memo[row["key"]] = row["sha256"]
                    except (ValueError, KeyError, TypeError):
                        continue
        except OSError:
            pass
    return _memo


def stream_sha256(path: Path | str) -> str:
    """sha256 of a file read in 1 MiB blocks, never memoised (for files that change, e.g. records)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_hash = stream_sha256  # file_sha256's hashing step (tests count its calls)


def file_sha256(path: Path | str) -> str:
    path = Path(path)
    st = os.stat(path)
    if st.st_size < SMALL:
        return _hash(path)
    key = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    memo = _load()
    if key not in memo:
        digest = _hash(path)
        after = os.stat(path)
        if (after.st_size, after.st_mtime_ns, after.st_ino) != (st.st_size, st.st_mtime_ns, st.st_ino) \
                or time.time() - after.st_mtime < RACY_S:
            # Changed while being read, or written moments ago: a same-size rewrite within the clock's
            # granularity would keep this key (git's "racily clean" case). Hashed again next time.
            return digest
        memo[key] = digest
        try:
            target = _memo_path()
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps({"key": key, "sha256": memo[key]}) + "\n").encode("utf-8"))
            finally:
                os.close(fd)
        except OSError:
            pass  # a read-only cache only costs the hash next time
    return memo[key]
