"""Prompt token counts kept on disk between runs, so a rerun plans without loading a tokenizer.

Counting a prompt's tokens is the only reason planning needs the engine's tokenizer (niah also counts
while it fills a haystack to length). On the reference engine that means importing transformers and
torch: ~9 s on a 2-core CPU for a run whose records are all there already. The counts are a pure
function of the tokenizer and the rendered prompt, so they are cached under a key naming exactly that:
the engine's `token_count_key()` (tokenizer identity and library versions) plus the chat-template
kwargs. An engine without that method is simply not cached.

Format: `<records_dir>/token_counts/<key[:20]>.jsonl`, one `{"h": prompt hash, "n": tokens}` per line,
appended with one write per line; a torn or unreadable line is ignored (it is a cache: the worst
case is counting again).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fp8eval.records import canonical_json, fingerprint_hash
from fp8eval.records.store import io_error


class TokenCountCache:
    def __init__(self, root: Path, key_material: dict):
        self.key = fingerprint_hash(key_material)
        self.path = Path(root) / "token_counts" / f"{self.key[:20]}.jsonl"
        self.material = key_material
        self._counts: dict[str, int] | None = None

    def _load(self) -> dict[str, int]:
        if self._counts is None:
            self._counts = {}
            if self.path.exists():
                with open(self.path, "r", encoding="utf-8") as f:
                    for line in f:
                        try:
                            row = json.loads(line)
                            n = row["n"]
                        except (ValueError, KeyError, TypeError):
                            continue
                        # a count that is not a non-negative integer is not trusted: it is counted again
                        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
                            self._counts[str(row["h"])] = n
        return self._counts

    def get(self, prompt_hash: str) -> int | None:
        return self._load().get(prompt_hash)

    def put(self, prompt_hash: str, n: int) -> None:
        counts = self._load()
        if counts.get(prompt_hash) == n:
            return
        counts[prompt_hash] = n
        if not self.path.exists():
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                meta = self.path.with_suffix(".key.json")
                meta.write_text(json.dumps(self.material, indent=2, sort_keys=True, default=str) + "\n",
                                encoding="utf-8")
            except OSError as e:
                raise io_error(e, "write token counts to", Path(e.filename or self.path)) from None
        line = (canonical_json({"h": prompt_hash, "n": int(n)}) + "\n").encode("utf-8")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)  # one write per line: concurrent runs interleave whole lines
            finally:
                os.close(fd)
        except OSError as e:
            raise io_error(e, "write token counts to", Path(e.filename or self.path)) from None

