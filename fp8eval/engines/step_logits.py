"""The logits a reference-engine arm computed at each step of a greedy-or-sampled generation, kept for the anatomy of a
flip (fp8eval.anatomy, `ReferenceEngine.teacher_force`).

Teacher forcing the baseline's completion through an arm asks for the arm's logits at the parting position p, after
the prompt and the first p tokens, which both completions share and which this arm generated itself. The reference
engine answers it by replaying what generation did (the prompt prefilled in `engine.prefill_chunk` chunks, then one
decode step per forced token, in a cache with the same room), which gives the generation's own logits bit for bit
(the CPU numerics are deterministic: fp8eval.engines.cpu_numerics). When the generation ran in this process, its
logits are still here: kept per (arm, prompt, room) in a small memo bounded in bytes, looked up instead of the replay,
with the same bits.
"""

from __future__ import annotations

import json
from collections import OrderedDict

# At most this many bytes of logits rows kept in all (the least recently stored request goes first). The default
# run keeps 9 requests x ~25 rows x 49152 float32 logits (~45 MB).
MEMO_BYTES = 128 << 20


class StepLogits:
    """A bounded memo: key -> (the generated token ids, the logits row before each of them, and the one after the
    last when it was computed)."""

    def __init__(self, max_bytes: int = MEMO_BYTES):
        self.max_bytes = int(max_bytes)
        self._items: OrderedDict = OrderedDict()
        self._bytes = 0

    def recorder(self, key) -> "_Recorder":
        """A recorder for one request's steps; `keep()` stores what it saw (nothing if it outgrew the memo)."""
        return _Recorder(self, key)

    def _put(self, key, tokens: list[int], rows: list, size: int) -> None:
        """Store `rows` (`size` bytes in all) under `key`, dropping the oldest entries to stay within max_bytes."""
        if size > self.max_bytes:
            return
        if key in self._items:
            self._bytes -= self._items.pop(key)[2]
        while self._items and self._bytes + size > self.max_bytes:
            self._bytes -= self._items.popitem(last=False)[1][2]
        self._items[key] = (tuple(tokens), rows, size)
        self._bytes += size

    def row(self, key, prefix: list[int]):
        """The logits row computed after `prefix` (the generated tokens before the wanted position), or None when this
        memo has no generation of that key that began with exactly those tokens."""
        got = self._items.get(key)
        if got is None:
            return None
        tokens, rows, _ = got
        p = len(prefix)
        if p >= len(rows) or tuple(prefix) != tokens[:p]:
            return None
        return rows[p]


class _Recorder:
    def __init__(self, memo: StepLogits, key):
        self.memo, self.key = memo, key
        self.rows: list | None = []
        self.bytes = 0

    def add(self, logits_row) -> None:
        """Keep one step's logits row [vocab] (a reference: each step's logits are a fresh tensor)."""
        if self.rows is None:
            return
        self.bytes += logits_row.numel() * logits_row.element_size()
        if self.bytes > self.memo.max_bytes:
            self.rows = None  # too long a generation to keep: the anatomy replays it
            return
        self.rows.append(logits_row)

    def keep(self, tokens: list[int]) -> None:
        """Store the rows with the tokens generated after them (row i came before token i)."""
        if self.rows is not None and self.rows:
            self.memo._put(self.key, tokens, self.rows, self.bytes)


def request_max_tokens(req) -> int:
    """The output tokens a reference-engine request has room for (its sampling's max_tokens, 256 when unset)."""
    return int(req.sampling.get("max_tokens") or 256)


def _memo(engine) -> StepLogits:
    return engine._shared.setdefault("step_logits", StepLogits())


def _key(engine, ids: list[int], max_tokens: int):
    """An arm's generation of one prompt with one room: the arm's name and KV policy, the prompt, the room."""
    if getattr(engine, "_memo_policy", None) is None:
        engine._memo_policy = (engine.kv.name, json.dumps(engine.describe()["kv"], sort_keys=True, default=str))
    return (*engine._memo_policy, tuple(ids), len(ids) + max_tokens)


def recorder_for(engine, req, ids: list[int], max_tokens: int) -> _Recorder | None:
    """A recorder of this request's step logits when the anatomy may teacher-force it: one sequence, an arm other than
    the baseline, `anatomy` on; else None."""
    if req.n != 1 or getattr(engine.kv, "role", "") == "baseline" or not getattr(engine.cfg, "anatomy", False):
        return None
    return _memo(engine).recorder(_key(engine, ids, max_tokens))


def forced_logits(engine, req, prompt: list[int], prefix: list[int]):
    """The reference engine's logits [vocab] after `prompt` and the forced `prefix`: what its generation computed there
    when it generated that prefix itself in this process (the memo), else the same computation replayed: the prompt
    prefilled in chunks into a cache with the generation's room, then one decode step per forced token."""
    import torch

    max_tokens = request_max_tokens(req)
    row = _memo(engine).row(_key(engine, prompt, max_tokens), prefix)
    if row is not None:
        return row
    with torch.inference_mode():
        cache, logits = engine._prefill(prompt, len(prompt) + max_tokens, count=False)
        for t in prefix:
            logits = engine._decode(cache, torch.tensor([[t]]))
    return logits[0]
