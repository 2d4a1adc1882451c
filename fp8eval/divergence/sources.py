"""Where an arm's next-token distributions come from: whatever its engine's `capabilities.distributions` says, on the
kernel path `divergence.path` names (fp8eval.divergence.paths).

- "hidden" (the reference engine): the final hidden state at every position, through the engine's public probe
  (`engine.probe()`: one prefill through the emulated cache, in the engine's prefill chunks; or, on the decode path,
  `probe.decode_hidden`: each row as its decode step computes it); logits are made from it only when compared (lm_head per slice),
  so an 8k x 49k logit matrix never exists whole and the kept per-passage result is small.
- "topk" (vLLM): the top-k of `prompt_logprobs` at every position (vLLM returns no full distributions), or of its
  decode steps with the passage forced (`decode_logprobs_many`, fp8eval.engines.vllm.forced).
"""

from __future__ import annotations

import numpy as np

from fp8eval.engines.base import EngineError


def source_kind(engine) -> str:
    """What the engine gives: 'hidden' or 'topk' (its capabilities); EngineError for an engine that gives neither."""
    kind = engine.capabilities.distributions
    if kind not in ("hidden", "topk"):
        raise EngineError(f"python -m fp8eval.divergence needs per-position distributions; the {engine.kind} engine "
                          f"gives none (for a server, start vLLM on the GPU box and use engine=vllm, or "
                          f"engine=reference on the CPU).")
    return kind


def compute(engine, ids: tuple[int, ...], topk: int, path: str = "prefill", batch_lengths=None) -> dict[str, np.ndarray]:
    """One passage through one arm on one kernel path (fp8eval.divergence.paths): {"hidden": [L, d]} or {"ids":
    [L-1, k], "logprobs": [L-1, k](, "token_logprobs": [L-1])}. `batch_lengths`: on the decode path, the lengths of
    the passages decoded with it (the emulated kernel's split count follows the decode batch)."""
    if source_kind(engine) == "hidden":
        with engine.probe() as probe:
            return {"hidden": probe.hidden(ids) if path == "prefill" else probe.decode_hidden(ids, batch_lengths)}
    return topk_result(topk_rows(engine, path)([list(ids)], topk)[0])


def topk_rows(engine, path: str):
    """The engine's call that gives several passages' top-k rows on `path` in one go (EngineError when it has none)."""
    if path != "decode":
        return engine.prompt_logprobs_many
    if engine.capabilities.decode_path != "forced":
        raise EngineError(f"the {engine.kind} engine has no decode-path log-probs; use divergence.path=prefill")
    return engine.decode_logprobs_many


def topk_result(row) -> dict[str, np.ndarray]:
    """(top-k ids, top-k log-probs[, own token's log-probs]) as the arrays kept per passage."""
    out = {"ids": np.asarray(row[0], dtype=np.int64), "logprobs": np.asarray(row[1], dtype=np.float32)}
    if len(row) > 2:
        out["token_logprobs"] = np.asarray(row[2], dtype=np.float32)
    return out
