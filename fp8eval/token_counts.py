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
from typing import Callable

from fp8eval.core.types import Prompt, Request
from fp8eval.engines.base import EngineError
from fp8eval.records import canonical_json, fingerprint_hash
from fp8eval.records.store import io_error


class PromptCounter:
    """Prompt tokens under the engine's template, counted once per distinct prompt (a 1M-token MRCR row is
    tokenised once even though the task and the length budget both ask) and, with `disk`, kept between runs.
    `many()` sends the prompts not known yet to the engine together: `count_prompt_tokens_many` where the
    engine has it (vLLM tokenizes a batch in parallel), one `count_prompt_tokens` each otherwise."""

    def __init__(self, engine, request_of: Callable[[Prompt], Request], disk: "TokenCountCache | None"):
        self.engine, self.request_of, self.disk = engine, request_of, disk
        self.counts: dict[str, int] = {}
        self.engine_calls = 0  # engine round trips (a batch is one), for summary.json's timing

    def __call__(self, prompt: Prompt) -> int:
        return self.many([prompt])[0]

    def many(self, prompts: list[Prompt]) -> list[int]:
        """The token counts of `prompts`, in order."""
        hashes = [p.hash() for p in prompts]
        todo: dict[str, Prompt] = {}
        for h, p in zip(hashes, prompts):
            if h in self.counts or h in todo:
                continue
            n = self.disk.get(h) if self.disk is not None else None
            if n is None:
                todo[h] = p
            else:
                self.counts[h] = n
        if todo:
            requests = [self.request_of(p) for p in todo.values()]
            batch = getattr(self.engine, "count_prompt_tokens_many", None)
            if batch is not None and len(requests) > 1:
                got = [int(n) for n in batch(requests)]
                self.engine_calls += 1
                if len(got) != len(requests):
                    raise EngineError(f"the engine counted the tokens of {len(got)} of the {len(requests)} prompts it was sent")
            else:
                got = [int(self.engine.count_prompt_tokens(r)) for r in requests]
                self.engine_calls += len(requests)
            for h, n in zip(todo, got):
                self.counts[h] = n
                if self.disk is not None:
                    self.disk.put(h, n)
        return [self.counts[h] for h in hashes]


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

