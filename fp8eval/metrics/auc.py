"""Derived metrics that are not a plain mean: MRCR token bins and the Context Arena AUC.

Pure functions over numbers; they never read records or files.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bin:
    label: str  # Context Arena names a column by its upper edge
    lo: int  # exclusive, except the first bin, which includes it
    hi: int  # inclusive


# The 8 official openai/mrcr bins by o200k_base token count: [4096, 8192], then (lo, hi].
MRCR_BINS: tuple[Bin, ...] = (
    Bin("8k", 4096, 8192),
    Bin("16k", 8192, 16384),
    Bin("32k", 16384, 32768),
    Bin("64k", 32768, 65536),
    Bin("128k", 65536, 131072),
    Bin("256k", 131072, 262144),
    Bin("512k", 262144, 524288),
    Bin("1M", 524288, 1048576),
)
MRCR_LABELS: tuple[str, ...] = tuple(b.label for b in MRCR_BINS)
MRCR_EDGES: tuple[int, ...] = tuple(b.hi for b in MRCR_BINS)
EDGE_OF_LABEL: dict[str, int] = {b.label: b.hi for b in MRCR_BINS}
LABEL_OF_EDGE: dict[int, str] = {b.hi: b.label for b in MRCR_BINS}


def bucket_of(n_tokens: int) -> str | None:
    """The bin label of a conversation of n_tokens o200k tokens, or None outside [4096, 1048576]."""
    first = MRCR_BINS[0]
    if first.lo <= n_tokens <= first.hi:
        return first.label
    for b in MRCR_BINS[1:]:
        if b.lo < n_tokens <= b.hi:
            return b.label
    return None


def context_arena_auc(scores_by_edge: dict[int, float], up_to: int) -> float:
    """Area under score-vs-tokens, as Context Arena computes it.

    Trapezoids over a linear token axis between consecutive bin upper edges (8192 ... up_to), divided
    by (up_to - 8192). The integral stops at the last edge that has a score: a model that cannot reach
    the next bin gets no area there (no sloped segment down to zero), yet the divisor stays, so AUC@1M
    of a 128k model is small by design. Edges above up_to are ignored.

    Scores must cover a contiguous run of edges starting at 8192; a gap would make the area depend on
    an interpolation Context Arena never does, so it is an error.
    """
    if up_to not in MRCR_EDGES[1:]:
        raise ValueError(f"up_to must be one of {list(MRCR_EDGES[1:])}, got {up_to}")
    unknown = sorted(set(scores_by_edge) - set(MRCR_EDGES))
    if unknown:
        raise ValueError(f"scores_by_edge has edges that are not MRCR bin edges: {unknown}")
    for edge, score in scores_by_edge.items():
        if not 0.0 <= score <= 1.0:
            raise ValueError(f"score at edge {edge} is {score}, outside [0, 1]")
    edges = [e for e in MRCR_EDGES if e <= up_to]
    scored = [e for e in edges if e in scores_by_edge]
    if not scored or scored[0] != edges[0]:
        raise ValueError(f"scores must start at edge {edges[0]}; got edges {scored}")
    if scored != edges[: len(scored)]:
        missing = [e for e in edges[: edges.index(scored[-1]) + 1] if e not in scores_by_edge]
        raise ValueError(f"scores have a gap at edges {missing}; AUC needs a contiguous run")
    area = 0.0
    for left, right in zip(scored, scored[1:]):
        area += (scores_by_edge[left] + scores_by_edge[right]) / 2.0 * (right - left)
    return area / (up_to - edges[0])
