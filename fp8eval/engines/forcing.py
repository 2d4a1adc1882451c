"""Teacher forcing for the anatomy of a flip (the optional engine capability `teacher_force`).

`teacher_force(request, forced_text, other_text)` answers, for one (sample, repeat) whose answer flipped: where
the two completions part (the first token, under this engine's tokenizer, at which `forced_text` -- the
baseline's completion -- and `other_text` -- this arm's own -- differ), and, with the baseline's completion
forced through this arm after the prompt, this arm's log-probability of the baseline's token there, its rank
(1 = this arm's own greedy choice) and this arm's most likely token there. Engines: reference (exact: the logits
its generation computed, kept or replayed bit for bit, fp8eval.engines.step_logits), vllm (prompt_logprobs in the
worker), server (echo logprobs), fake (scripted).
"""

from __future__ import annotations

from typing import Callable, Sequence


def part_position(forced: Sequence[int], other: Sequence[int]) -> int:
    """The first index at which the two token sequences differ (the shorter one's length when one is a prefix
    of the other)."""
    n = min(len(forced), len(other))
    return next((i for i in range(n) if forced[i] != other[i]), n)


def forced_ids(forced: list[int], other: list[int], eos: int | None) -> tuple[list[int], int]:
    """The tokens to force (the baseline's completion up to and including the parting token; its end-of-text
    token when the baseline stopped there) and the parting position."""
    p = part_position(forced, other)
    if p < len(forced):
        return forced[:p + 1], p
    return (forced + [eos] if eos is not None else forced), p


def answer(p: int, forced: list[int], other: list[int], row: dict | None, decode: Callable[[int], str]) -> dict:
    """The anatomy of one flip from the forced row at the parting position `p` ({logprob, rank, top1 id or
    top1_text}; None when the completions never part)."""
    out = {"part_position": p, "forced_tokens": len(forced), "other_tokens": len(other),
           "forced_token": decode(forced[p]) if p < len(forced) else "<end>",
           "other_token": decode(other[p]) if p < len(other) else "<end>",
           "logprob": None, "rank": None, "top1_token": None}
    if row is not None:
        top1 = row["top1_text"] if "top1_text" in row else decode(row["top1"]) if row.get("top1") is not None else None
        out.update(logprob=row.get("logprob"), rank=row.get("rank"), top1_token=top1)
    return out
