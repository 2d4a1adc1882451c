"""Where an arm's next-token distributions come from, per engine.

- reference: the final hidden state at every position (one prefill through the emulated cache, in the
  engine's prefill chunks); logits are made from it only when compared (lm_head per slice), so an 8k x 49k
  logit matrix never exists whole and the kept per-passage result is small.
- vllm: the top-k of vLLM's `prompt_logprobs` at every position (vLLM returns no full distributions), or of its
  decode steps with the passage forced (`divergence.path=decode`, fp8eval.engines.vllm.forced).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fp8eval.engines.base import EngineError

# What each engine kind gives: "hidden" (exact, full vocabulary) or "topk".
KIND_OF_ENGINE = {"reference": "hidden", "vllm": "topk"}


def source_kind(engine) -> str:
    """What the engine gives: 'hidden' (reference) or 'topk' (vllm); EngineError for any other engine."""
    kind = KIND_OF_ENGINE.get(getattr(engine, "kind", ""))
    if kind is None:
        raise EngineError(f"python -m fp8eval.divergence runs on engine=reference or engine=vllm; engine="
                          f"{getattr(engine, 'kind', '?')} gives no per-position distributions here "
                          f"(for a server, start vLLM on the GPU box and use engine=vllm).")
    return kind


def compute(engine, ids: tuple[int, ...], topk: int, path: str = "prefill") -> dict[str, np.ndarray]:
    """One passage through one arm on one kernel path (fp8eval.divergence.paths): {"hidden": [L, d]} or {"ids":
    [L-1, k], "logprobs": [L-1, k](, "token_logprobs": [L-1])}."""
    if source_kind(engine) == "hidden":
        return {"hidden": reference_hidden(engine, ids) if path == "prefill" else engine.decode_hidden(list(ids))}
    return topk_result(topk_rows(engine, path)([list(ids)], topk)[0])


def topk_rows(engine, path: str):
    """The engine's call that gives several passages' top-k rows on `path` in one go (EngineError when it has none)."""
    if path == "decode":
        if not callable(getattr(engine, "decode_logprobs_many", None)):
            raise EngineError(f"the {getattr(engine, 'kind', '?')} engine here has no decode-path log-probs; use "
                              f"divergence.path=prefill")
        return engine.decode_logprobs_many
    if callable(getattr(engine, "prompt_logprobs_many", None)):
        return engine.prompt_logprobs_many
    return lambda batch, k: [engine.prompt_logprobs(ids, k) for ids in batch]


def topk_result(row) -> dict[str, np.ndarray]:
    """(top-k ids, top-k log-probs[, own token's log-probs]) as the arrays kept per passage."""
    out = {"ids": np.asarray(row[0], dtype=np.int64), "logprobs": np.asarray(row[1], dtype=np.float32)}
    if len(row) > 2:
        out["token_logprobs"] = np.asarray(row[2], dtype=np.float32)
    return out


def reference_hidden(engine, ids: tuple[int, ...]) -> np.ndarray:
    """The last hidden state (after the final norm) at every position, through the arm's emulated cache."""
    import torch
    from transformers import DynamicCache

    engine._load()
    engine._shared["active_policy"] = engine._policy
    model = engine._model
    device = engine._device_name()
    x = torch.tensor([list(ids)], device=device)
    chunk = max(1, int(engine.cfg.engine.prefill_chunk))
    out = []
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        for start in range(0, x.shape[1], chunk):
            h = model.model(input_ids=x[:, start:start + chunk], past_key_values=cache, use_cache=True)
            out.append(h.last_hidden_state[0].float().cpu())
            engine.computed_prefill_tokens += min(chunk, x.shape[1] - start)
    return torch.cat(out).numpy()


def logits_from_hidden(engine, hidden: np.ndarray) -> Any:
    """lm_head (and the model's final logit soft-capping, if any) on a slice of hidden states."""
    import torch

    model = engine._model
    head = model.get_output_embeddings()
    h = torch.from_numpy(np.ascontiguousarray(hidden)).to(head.weight.device, head.weight.dtype)
    with torch.inference_mode():
        logits = head(h).float()
        cap = getattr(model.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
    return logits
