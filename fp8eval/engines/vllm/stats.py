"""vLLM's own counters: prompt tokens and prefix-cache hits, from the offline metrics or /metrics."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def prefill_stats(counters: dict[str, float] | None) -> dict[str, Any] | None:
    """An arm's prefill work from vLLM's counters: `vllm:prompt_tokens` counts a prompt once per
    sequence (n=5 counts it five times), so the tokens actually computed are prompt tokens minus
    prefix-cache hits."""
    if not counters or not counters.get("prompt_tokens"):
        return None
    prompt, hits = float(counters["prompt_tokens"]), float(counters.get("prefix_cache_hits", 0.0))
    if not (math.isfinite(prompt) and math.isfinite(hits) and prompt > 0 and 0 <= hits <= prompt):
        return None  # counters that cannot be true (a server restarted mid-run, or lying): no figure at all
    return {"prompt_tokens_counted": int(prompt), "prefix_cache_hits": int(hits),
            "computed_prefill_tokens": int(prompt - hits), "prefix_cache_hit_rate": round(hits / prompt, 6)}


def metric_totals(text: str, names: Iterable[str]) -> dict[str, float]:
    """Sum each `vllm:<name>_total` counter over its label sets in a Prometheus text exposition."""
    totals = {n: 0.0 for n in names}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        metric, _, value = line.rpartition(" ")
        name = metric.split("{", 1)[0].removeprefix("vllm:").removesuffix("_total")
        if name in totals:
            try:
                totals[name] += float(value)
            except ValueError:
                continue
    return totals
