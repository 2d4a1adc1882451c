"""Ranking layers by sensitivity and choosing the smallest BF16 skip list (pure functions, no torch).

The model behind the choice is additive: keeping a set S of layers in BF16 removes the share
sum(score[S]) / sum(score) of the full-FP8 divergence. KL is second order in the perturbation, so
independent rounding errors of different layers add up to first order; the cross terms are what the
re-measurement (`kl_with_skip`) checks.
"""

from __future__ import annotations


def layer_scores(kl_full: float, only: dict[int, float], all_but: dict[int, float], rank_by: str) -> dict[int, float]:
    """Score per layer (higher = more sensitive), never negative."""
    if rank_by == "only_this":
        return {i: max(float(only[i]), 0.0) for i in only}
    if rank_by == "all_but_this":
        # What keeping this one layer in BF16 removes; below zero is measurement noise.
        return {i: max(float(kl_full) - float(all_but[i]), 0.0) for i in all_but}
    raise ValueError(f"rank_by={rank_by!r}; valid: only_this, all_but_this")


def rank(scores: dict[int, float], tiebreak: dict[int, float] | None = None) -> list[int]:
    """Layer indices, most sensitive first; ties broken by `tiebreak` (descending), then by index."""
    tb = tiebreak or {}
    return sorted(scores, key=lambda i: (-scores[i], -tb.get(i, 0.0), i))


def predicted_share(scores: dict[int, float], chosen: list[int]) -> float:
    """The share of the full-FP8 divergence that keeping `chosen` in BF16 removes under the additive model (0.0 when the
    scores sum to 0)."""
    total = sum(scores.values())
    return sum(scores[i] for i in chosen) / total if total > 0 else 0.0


def smallest_skip_set(ranking: list[int], scores: dict[int, float], target: float) -> list[int]:
    """The shortest prefix of the ranking whose predicted share reaches the target (sorted indices).

    Under the additive model the top-k layers by score remove the most of any k layers, so the first
    prefix that reaches the target is a smallest set. All scores zero (FP8 changes nothing): no layer.
    """
    total = sum(scores.values())
    if total <= 0:
        return []
    chosen: list[int] = []
    acc = 0.0
    for i in ranking:
        if acc / total >= target - 1e-12:
            break
        chosen.append(i)
        acc += scores[i]
    return sorted(chosen)


def kv_bytes_ratio(values_per_token: dict[int, int], skip: list[int], fp8_bytes: int = 1, bf16_bytes: int = 2) -> float:
    """Bytes per cached token with `skip` kept in BF16 (2 bytes a value) and the rest FP8 (1 byte),
    relative to an all-BF16 cache: 0.5 = full FP8, 1.0 = every layer skipped."""
    full = sum(n * bf16_bytes for n in values_per_token.values())
    if full == 0:
        return float("nan")
    mixed = sum(n * (bf16_bytes if i in skip else fp8_bytes) for i, n in values_per_token.items())
    return mixed / full


def skip_layer_strings(skip: list[int]) -> list[str]:
    """vLLM's `kv_cache_dtype_skip_layers` is a list[str] (indices or attention types)."""
    return [str(i) for i in sorted(skip)]


def sliding_verdict(layers: list[dict], ranking: list[int], recommended: list[int], scores: dict[int, float],
                    kl_full: float | None = None, kl_skip_sliding: float | None = None) -> dict | None:
    """For hybrid models: are the sliding-window layers the sensitive ones? None without such layers."""
    sliding = [d["index"] for d in layers if "sliding" in str(d.get("attention_type", ""))]
    if not sliding or len(sliding) == len(layers):
        return None
    n = len(layers)
    share = predicted_share(scores, sliding)
    top = ranking[:len(sliding)]
    out = {
        "sliding_layers": sorted(sliding),
        "count_share": len(sliding) / n,
        "divergence_share": share,
        "sliding_in_top": sum(1 for i in top if i in sliding),
        "recommended_sliding": sorted(i for i in recommended if i in sliding),
        "recommended_full": sorted(i for i in recommended if i not in sliding),
        "kl_skip_sliding": kl_skip_sliding,
        "removed_by_skip_sliding": (1 - kl_skip_sliding / kl_full) if kl_skip_sliding is not None and kl_full else None,
    }
    out["sliding_are_sensitive"] = share > out["count_share"]
    per_sliding = share / len(sliding)
    per_full = (1 - share) / (n - len(sliding))
    out["text"] = (
        f"The {len(sliding)} sliding-window layers ({100 * out['count_share']:.0f}% of the layers) carry "
        f"{100 * share:.0f}% of the single-layer divergence, {per_sliding / per_full:.2f}x as much per layer as "
        f"the {n - len(sliding)} full-attention layers: the sliding-window layers are "
        f"{'more' if per_sliding > per_full else 'less'} sensitive per layer. Of the recommended layers "
        f"{len(out['recommended_sliding'])} are sliding-window and {len(out['recommended_full'])} full-attention."
        if per_full > 0 else
        f"All the single-layer divergence sits in the {len(sliding)} sliding-window layers."
    )
    if out["removed_by_skip_sliding"] is not None:
        out["text"] += (f" Keeping all sliding-window layers in BF16 (kv=fp8_skip_sw) removes "
                        f"{100 * out['removed_by_skip_sliding']:.0f}% of the full-FP8 divergence (measured).")
    return out


def feasible_options(ranking: list[int], full_layers: list[int]) -> list[list[int]]:
    """The skip lists worth checking for feasibility: every prefix of the ranking, and each prefix with all
    full-attention layers added or removed (what vLLM 0.26.0's page-size rule is about), without repeats."""
    seen, out = set(), []
    full = set(full_layers)
    for k in range(len(ranking) + 1):
        p = set(ranking[:k])
        for cand in (p, p | full if p & full else p, p - full):
            key = tuple(sorted(cand))
            if key not in seen:
                seen.add(key)
                out.append(list(key))
    return out


def best_feasible(options: list[list[int]], feasible: dict[tuple, bool], scores: dict[int, float], target: float,
                  cost: dict[int, int]) -> list[int] | None:
    """Among the feasible options, the cheapest (fewest extra KV bytes, then fewest layers) whose predicted share
    reaches the target; else the feasible one that removes the most. None when none is feasible."""
    ok = [o for o in options if feasible.get(tuple(o))]
    if not ok:
        return None
    weight = lambda o: (sum(cost.get(i, 1) for i in o), len(o), o)  # noqa: E731
    meets = [o for o in ok if predicted_share(scores, o) >= target - 1e-12]
    if meets:
        return min(meets, key=weight)
    return max(ok, key=lambda o: (predicted_share(scores, o), [-w for w in weight(o)[:2]]))
