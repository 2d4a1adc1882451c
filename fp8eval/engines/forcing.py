"""Teacher forcing for the anatomy of a flip (the optional engine capability `teacher_force`).

`teacher_force(request, forced_text, other_text)` answers, for one (sample, repeat) whose answer flipped: where
the two completions part (the first token, under this engine's tokenizer, at which `forced_text` -- the
baseline's completion -- and `other_text` -- this arm's own -- differ), and, with the baseline's completion
forced through this arm after the prompt, this arm's log-probability of the baseline's token there, its rank
(1 = this arm's own greedy choice) and this arm's most likely token there. Engines: reference (exact: the logits
its generation computed, kept or replayed bit for bit, fp8eval.engines.step_logits: the decode path, with the prefill
view beside it), vllm (its generation replayed with log-probs: the decode path where the replay re-generates the
shared tokens, else prompt_logprobs, the prefill path; fp8eval.engines.vllm.prompt_ops), server (echo logprobs: the
prefill path), fake (scripted). Each row says which path it was read on (`path`).
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


def row_from_logits(logits, token: int) -> dict:
    """{logprob, rank, top1} of `token` under one position's logits (a torch vector)."""
    import torch

    logp = torch.log_softmax(logits.float(), -1)
    return {"logprob": float(logp[token]), "rank": int((logp > logp[token]).sum()) + 1, "top1": int(logp.argmax())}


def answer(p: int, forced: list[int], other: list[int], row: dict | None, decode: Callable[[int], str],
           path: str | None = None, prefill: dict | None = None) -> dict:
    """The anatomy of one flip from the forced row at the parting position `p` ({logprob, rank, top1 id or
    top1_text}; None when the completions never part). `path`: the kernel path the row was read on (decode: where the
    arm produced its answer; prefill: one forward of prompt and forced tokens; the first generated token always comes
    from the prompt's prefill); `prefill`: the same position's row read on the prefill path, kept beside a decode row
    as logprob_prefill / rank_prefill (how far the prefill view is off, issue 35)."""
    out = {"part_position": p, "forced_tokens": len(forced), "other_tokens": len(other),
           "forced_token": decode(forced[p]) if p < len(forced) else "<end>",
           "other_token": decode(other[p]) if p < len(other) else "<end>",
           "logprob": None, "rank": None, "top1_token": None}
    if row is not None:
        top1 = row["top1_text"] if "top1_text" in row else decode(row["top1"]) if row.get("top1") is not None else None
        out.update(logprob=row.get("logprob"), rank=row.get("rank"), top1_token=top1)
    if path is not None:
        out["path"] = path
    if prefill is not None:
        out.update(logprob_prefill=prefill.get("logprob"), rank_prefill=prefill.get("rank"))
    return out
