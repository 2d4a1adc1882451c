"""How far one arm's next-token distributions move from its baseline's: pure per-position measures.

Everything here works on arrays of one document's positions and returns per-position arrays (numpy,
float64), plus the position buckets that summarise them. No model, no file, no config.

Two ways to get the distributions, two KL functions:

- `kl_from_logits`: both arms' full-vocabulary logits (the reference engine). Exact KL(base || variant).
- `kl_from_topk`: each arm's top-k token ids and log-probabilities at each position (vLLM's and the
  server's `prompt_logprobs`). Only tokens present in BOTH arms' top-k are known in both distributions, so
  the KL is taken over that shared set with both distributions renormalised to it. This is an
  approximation: it ignores the mass outside the shared set (on the reference engine, measured against the
  exact KL, it read 12-22 % low for a K/V-only FP8 cache, issue 18); `n_shared` says how many tokens it used.

Stable API (issue 16's sensitivity tooling builds on it): `kl_from_logits`, `kl_from_topk`,
`top1_from_logits`, `dlogp_from_logits`, `top1_from_topk`, `dlogp_from_topk`, `DEFAULT_EDGES`,
`bucket_label`, `bucket_labels`, `bucket_index`, `BucketAccumulator`, `MEASURES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# The measures a bucket reports, in the order `divergence.json` lists them.
MEASURES = ("kl_mean", "top1_agree", "dlogp_mean", "n_tokens")

# Position bucket edges in tokens: [0, 256), [256, 1k), [1k, 2k), ... Positions past the last edge fall in
# an open last bucket ("128k+").
DEFAULT_EDGES: tuple[int, ...] = (0, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def _as_np(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, possibly on a GPU, possibly bfloat16
        x = x.detach().float().cpu().numpy()
    return np.asarray(x)


def _log_softmax(logits):
    """log_softmax over the last axis in float64 (torch when given a tensor: it may sit on a GPU)."""
    if hasattr(logits, "detach"):
        import torch

        return torch.log_softmax(logits.detach().to(torch.float64), dim=-1)
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def kl_from_logits(base_logits, variant_logits) -> np.ndarray:
    """Exact KL(base || variant) in nats at each position, from full logits of shape [T, V].

    Accepts numpy arrays or torch tensors (computed in float64 where they live, then returned as numpy).
    """
    lp, lq = _log_softmax(base_logits), _log_softmax(variant_logits)
    if hasattr(lp, "detach"):
        kl = (lp.exp() * (lp - lq)).sum(dim=-1).clamp_min(0.0)
        return kl.cpu().numpy()
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    return np.maximum(kl, 0.0)


def top1_from_logits(base_logits, variant_logits) -> np.ndarray:
    """Whether both arms' argmax tokens agree at each position (bool array of length T)."""
    if hasattr(base_logits, "detach"):
        return (base_logits.argmax(dim=-1) == variant_logits.argmax(dim=-1)).cpu().numpy()
    return np.asarray(base_logits).argmax(axis=-1) == np.asarray(variant_logits).argmax(axis=-1)


def dlogp_from_logits(base_logits, variant_logits) -> np.ndarray:
    """|log p_variant(t) - log p_base(t)| for t = the baseline's argmax token, at each position."""
    lp, lq = _log_softmax(base_logits), _log_softmax(variant_logits)
    if hasattr(lp, "detach"):
        t = lp.argmax(dim=-1, keepdim=True)
        return (lp.gather(-1, t) - lq.gather(-1, t)).abs().squeeze(-1).cpu().numpy()
    t = lp.argmax(axis=-1)[:, None]
    return np.abs(np.take_along_axis(lp, t, -1) - np.take_along_axis(lq, t, -1))[:, 0]


def _matched_variant_logprobs(base_ids, var_ids, var_lp) -> np.ndarray:
    """For each base top-k token, the variant's log-prob of it, or -inf where the variant's top-k lacks it."""
    base_ids, var_ids, var_lp = _as_np(base_ids), _as_np(var_ids), _as_np(var_lp).astype(np.float64)
    match = base_ids[:, :, None] == var_ids[:, None, :]  # [T, kb, kv]
    found = match.any(axis=-1)
    # At most one match per base token (ids within one position's top-k are distinct).
    lp = np.where(match, var_lp[:, None, :], 0.0).sum(axis=-1)
    return np.where(found, lp, -np.inf)


def kl_from_topk(base_ids, base_logprobs, variant_ids, variant_logprobs) -> tuple[np.ndarray, np.ndarray]:
    """Approximate KL(base || variant) per position from each arm's top-k ([T, k] ids and log-probs).

    Taken over the tokens in both arms' top-k, both distributions renormalised to that shared set.
    Returns (kl, n_shared): n_shared[t] is the size of the shared set (0 -> kl NaN, nothing in common).
    Padding: ids < 0 mark absent entries (a position with fewer than k logprobs).
    """
    b_ids = _as_np(base_ids)
    b_lp = _as_np(base_logprobs).astype(np.float64)
    v_lp = _matched_variant_logprobs(b_ids, variant_ids, variant_logprobs)
    shared = np.isfinite(v_lp) & (b_ids >= 0) & np.isfinite(b_lp)
    n_shared = shared.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        bp = np.where(shared, b_lp, -np.inf)
        vp = np.where(shared, v_lp, -np.inf)
        bn = bp - _logsumexp(bp)
        vn = vp - _logsumexp(vp)
        terms = np.where(shared, np.exp(bn) * (bn - vn), 0.0)
    kl = np.where(n_shared > 0, np.maximum(terms.sum(axis=-1), 0.0), np.nan)
    return kl, n_shared


def _logsumexp(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    return m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def top1_from_topk(base_ids, base_logprobs, variant_ids, variant_logprobs) -> np.ndarray:
    """Whether the two arms' most likely tokens agree at each position, from top-k lists."""
    b_ids, v_ids = _as_np(base_ids), _as_np(variant_ids)
    b_top = b_ids[np.arange(len(b_ids)), _as_np(base_logprobs).argmax(axis=-1)]
    v_top = v_ids[np.arange(len(v_ids)), _as_np(variant_logprobs).argmax(axis=-1)]
    return b_top == v_top


def dlogp_from_topk(base_ids, base_logprobs, variant_ids, variant_logprobs) -> np.ndarray:
    """|Δ log p| of the baseline's argmax token from top-k lists; NaN where the variant's top-k lacks it."""
    b_ids, b_lp = _as_np(base_ids), _as_np(base_logprobs).astype(np.float64)
    v_lp = _matched_variant_logprobs(b_ids, variant_ids, variant_logprobs)
    top = b_lp.argmax(axis=-1)
    rows = np.arange(len(b_ids))
    d = np.abs(v_lp[rows, top] - b_lp[rows, top])
    return np.where(np.isfinite(d), d, np.nan)


# --- position buckets --------------------------------------------------------------------------------

def _fmt_tokens(n: int) -> str:
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}k"
    return str(n)


def bucket_label(lo: int, hi: int | None) -> str:
    """'0-256', '1k-2k', '128k+' (k = 1024 tokens)."""
    return f"{_fmt_tokens(lo)}+" if hi is None else f"{_fmt_tokens(lo)}-{_fmt_tokens(hi)}"


def bucket_labels(edges: Sequence[int] = DEFAULT_EDGES) -> list[str]:
    """Labels of the buckets [e0, e1), [e1, e2), ..., [e_last, inf)."""
    e = list(edges)
    return [bucket_label(e[i], e[i + 1] if i + 1 < len(e) else None) for i in range(len(e))]


def bucket_index(positions, edges: Sequence[int] = DEFAULT_EDGES) -> np.ndarray:
    """The bucket of each 0-based token position (-1 for positions below the first edge)."""
    return np.searchsorted(np.asarray(edges), _as_np(positions), side="right") - 1


@dataclass
class BucketAccumulator:
    """Sums per bucket over any number of documents/chunks; `result()` gives the divergence.json buckets.

    NaN values (a top-k KL with nothing shared, a |Δ logp| whose token the variant's top-k lacks) are left
    out of that measure's mean and counted in `n_missing`, never silently dropped.
    """

    edges: tuple[int, ...] = DEFAULT_EDGES
    sums: dict = field(default_factory=dict)

    def add(self, positions, kl, top1, dlogp) -> None:
        """Add one chunk: 0-based positions and the per-position measures (equal lengths)."""
        idx = bucket_index(positions, self.edges)
        kl, top1, dlogp = _as_np(kl).astype(np.float64), _as_np(top1).astype(np.float64), _as_np(dlogp)
        dlogp = dlogp.astype(np.float64)
        for b in np.unique(idx):
            if b < 0:
                continue
            sel = idx == b
            s = self.sums.setdefault(int(b), {"n": 0, "kl": 0.0, "n_kl": 0, "top1": 0.0, "dlogp": 0.0,
                                               "n_dlogp": 0})
            s["n"] += int(sel.sum())
            k, d = kl[sel], dlogp[sel]
            s["kl"] += float(np.nansum(k))
            s["n_kl"] += int(np.isfinite(k).sum())
            s["top1"] += float(top1[sel].sum())
            s["dlogp"] += float(np.nansum(d))
            s["n_dlogp"] += int(np.isfinite(d).sum())

    @staticmethod
    def _stats(s: dict) -> dict:
        n = s["n"]
        out = {"kl_mean": s["kl"] / s["n_kl"] if s["n_kl"] else None,
               "top1_agree": s["top1"] / n if n else None,
               "dlogp_mean": s["dlogp"] / s["n_dlogp"] if s["n_dlogp"] else None,
               "n_tokens": n}
        missing = {"kl": n - s["n_kl"], "dlogp": n - s["n_dlogp"]}
        if any(missing.values()):
            out["n_missing"] = missing
        return out

    def result(self) -> dict[str, dict]:
        """{label: {kl_mean, top1_agree, dlogp_mean, n_tokens[, n_missing]}} for non-empty buckets, in order."""
        labels = bucket_labels(self.edges)
        return {labels[b]: self._stats(self.sums[b]) for b in sorted(self.sums)}

    def overall(self) -> dict:
        """The same measures over every position added."""
        tot = {"n": 0, "kl": 0.0, "n_kl": 0, "top1": 0.0, "dlogp": 0.0, "n_dlogp": 0}
        for s in self.sums.values():
            for k in tot:
                tot[k] += s[k]
        return self._stats(tot)
