"""Next-token sampling with vLLM's parameter meanings, one torch.Generator per sequence."""

from __future__ import annotations

import torch


def sample_next(logits: torch.Tensor, sp: dict, generators: list[torch.Generator]) -> torch.Tensor:
    """logits [n, vocab] float32 on CPU -> next ids [n]. temperature 0 (or None) is greedy."""
    temperature = sp.get("temperature")
    if not temperature:
        return logits.argmax(dim=-1)
    logits = logits / float(temperature)
    top_k = sp.get("top_k")
    if top_k and top_k > 0:
        kth = torch.topk(logits, min(int(top_k), logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    min_p = sp.get("min_p")
    if min_p:
        probs = probs.masked_fill(probs < float(min_p) * probs.max(dim=-1, keepdim=True).values, 0.0)
    top_p = sp.get("top_p")
    if top_p is not None and top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(dim=-1) - sorted_p < float(top_p)  # keep the token that crosses top_p
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.stack([torch.multinomial(probs[i], 1, generator=generators[i])[0] for i in range(probs.shape[0])])
