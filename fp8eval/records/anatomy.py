"""Where the anatomy of an arm's flips is kept (written by fp8eval.anatomy, read by the report).

`<records_dir>/anatomy/<task>/<arm fingerprint[:20]>.jsonl`, one JSON line per dissected flip, keyed by
(sample, repeat) and both completions' sha256 (`row_key`), so a changed completion is never matched with an
old dissection.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def _sha(text) -> str:
    return hashlib.sha256(str(text or "").encode("utf-8")).hexdigest()[:16]


def store_path(records_root: Path, task: str, fingerprint: str) -> Path:
    """Where an arm's dissected flips live."""
    return Path(records_root) / "anatomy" / task / f"{fingerprint[:20]}.jsonl"


def row_key(sample_id, repeat, baseline_completion, other_completion) -> str:
    """The key of one dissected flip: (sample, repeat) and both completions."""
    return f"{sample_id}\x00{int(repeat)}\x00{_sha(baseline_completion)}\x00{_sha(other_completion)}"


def load(path: Path) -> dict[str, dict]:
    """An arm's dissected flips by row_key (a torn or corrupt line is skipped: it is dissected again)."""
    out: dict[str, dict] = {}
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            row = json.loads(line)
            out[row["key"]] = row
        except (ValueError, KeyError, TypeError):
            continue
    return out
