"""Adapter to the divergence probe's measures (fp8eval.divergence.measures, issue 18).

TEMPORARY stand-in until branch `gpu` lands its `measures` module; then this file only re-exports it.
"""

from __future__ import annotations

import torch

DEFAULT_EDGES = [256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]


def _short(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def bucket_ranges(edges: list[int], n_positions: int) -> list[tuple[str, int, int]]:
    """[(label, lo, hi)] covering positions [0, n_positions)."""
    out, lo = [], 0
    for hi in [*edges, 1 << 62]:
        if lo >= n_positions:
            break
        out.append((f"{_short(lo)}-{_short(hi)}" if hi < 1 << 62 else f"{_short(lo)}+", lo, hi))
        lo = hi
    return out


def per_position(lp_base: torch.Tensor, lp_var: torch.Tensor):
    """KL(base || var), top-1 agreement, |delta logprob| of the base argmax, per position."""
    kl = (lp_base.exp() * (lp_base - lp_var)).sum(-1).clamp_min(0)
    a = lp_base.argmax(-1)
    top1 = a == lp_var.argmax(-1)
    dlogp = (lp_base.gather(-1, a[:, None]) - lp_var.gather(-1, a[:, None])).abs()[:, 0]
    return kl, top1, dlogp
