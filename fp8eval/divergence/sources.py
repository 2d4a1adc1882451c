"""Where an arm's next-token distributions come from: whatever its engine's `capabilities.distributions` says.

- "hidden" (the reference engine): the final hidden state at every position, through the engine's public probe
  (`engine.probe()`: one prefill through the emulated cache, in the engine's prefill chunks); logits are made
  from it only when compared (lm_head per slice), so an 8k x 49k logit matrix never exists whole and the kept
  per-passage result is small.
- "topk" (vLLM): the top-k of `prompt_logprobs` at every position (vLLM returns no full distributions).
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


def compute(engine, ids: tuple[int, ...], topk: int) -> dict[str, np.ndarray]:
    """One passage through one arm: {"hidden": [L, d]} or {"ids": [L-1, k], "logprobs": [L-1, k]}."""
    if source_kind(engine) == "hidden":
        with engine.probe() as probe:
            return {"hidden": probe.hidden(ids)}
    got_ids, got_lp = engine.prompt_logprobs(list(ids), topk)
    return {"ids": np.asarray(got_ids, dtype=np.int64), "logprobs": np.asarray(got_lp, dtype=np.float32)}
