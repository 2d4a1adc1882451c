"""The records store: one append-only JSONL file per arm, keyed by the arm fingerprint.

One line per (sample, repeat), flushed and fsync'd as soon as it is written, so a run killed with
SIGKILL loses at most the requests in flight; a rerun reads what is there and sends only the rest.
A torn last line (the process died mid-write) is ignored on read and repaired on the next append.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from fp8eval.core.hashing import canonical_json, fingerprint_hash  # noqa: F401 - re-exported

# 2: seeds are the sample's seed + repeat (fp8eval.seeds), so records seeded otherwise are never reused.
RECORD_SCHEMA = 2


def read_records(path: Path) -> list[dict]:
    """All complete records of a JSONL file; a torn final line is skipped."""
    out: list[dict] = []
    if not path.exists():
        return out
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # torn write at the end of a killed run
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


@dataclass
class ArmStore:
    """The records of one arm: `<root>/<task>/<fingerprint[:20]>.jsonl` plus its fingerprint file."""

    root: Path
    task: str
    fingerprint: str
    material: dict

    @property
    def path(self) -> Path:
        return self.root / self.task / f"{self.fingerprint[:20]}.jsonl"

    @property
    def meta_path(self) -> Path:
        return self.path.with_suffix(".arm.json")

    def open(self) -> "ArmStore":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.meta_path.exists():
            # A temp name per process: shards of one arm may open its store at the same moment.
            tmp = self.meta_path.with_name(f"{self.meta_path.name}.{os.getpid()}.tmp")
            tmp.write_text(
                json.dumps({"fingerprint": self.fingerprint, "material": self.material}, indent=2,
                           sort_keys=True, default=str) + "\n",
                encoding="utf-8",
            )
            os.replace(tmp, self.meta_path)
        self._repair_torn_tail()
        return self

    def _repair_torn_tail(self) -> None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
            f.seek(0)
            data = f.read()
            cut = data.rfind(b"\n") + 1
            f.truncate(cut)

    def records(self) -> list[dict]:
        return read_records(self.path)

    def done_keys(self) -> set[tuple[str, int]]:
        return {(r["sample_id"], r["repeat"]) for r in self.records()}

    def append(self, records: list[dict]) -> None:
        if not records:
            return
        text = "".join(canonical_json(r) + "\n" for r in records)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def iter_arm_files(root: Path) -> Iterator[Path]:
    yield from sorted(root.glob("*/*.jsonl"))
