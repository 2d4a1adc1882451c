"""Metrics derived from records, never stored anywhere else: arm scores and paired recovery."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable

DONE_STATUSES = ("ok", "skipped")


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _stderr(xs: list[float]) -> float | None:
    if len(xs) < 2:
        return 0.0 if xs else None
    m = sum(xs) / len(xs)
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    return math.sqrt(var / len(xs))


def select(records: Iterable[dict], keys: set[tuple[str, int]] | None) -> list[dict]:
    """The records of this run's (sample, repeat) keys (a store may hold more from larger runs)."""
    out = [r for r in records if keys is None or (r["sample_id"], r["repeat"]) in keys]
    return out


def arm_summary(records: list[dict]) -> dict:
    """Score = mean pass@1 over scored records. stderr: of the per-repeat means when there are several
    repeats (the spread a rerun would show), else of the per-sample scores."""
    scored = [r for r in records if r["status"] == "ok"]
    by_repeat: dict[int, list[float]] = defaultdict(list)
    by_group: dict[str, list[float]] = defaultdict(list)
    for r in scored:
        by_repeat[r["repeat"]].append(r["score"])
        for g in r.get("groups") or ():
            by_group[g].append(r["score"])
    repeat_means = [sum(v) / len(v) for _, v in sorted(by_repeat.items())]
    if len(repeat_means) > 1:
        stderr = _stderr(repeat_means)
    else:
        stderr = _stderr([r["score"] for r in scored])
    lengths = [r for r in scored if r.get("finish_reason") == "length"]
    return {
        "score": _mean([r["score"] for r in scored]),
        "stderr": stderr,
        "n_samples": len({r["sample_id"] for r in scored}),
        "n_repeats": len(by_repeat),
        "by_group": {g: sum(v) / len(v) for g, v in sorted(by_group.items(), key=lambda kv: _group_sort_key(kv[0]))},
        "n_records": len(records),
        "n_scored": len(scored),
        "n_skipped": sum(1 for r in records if r["status"] == "skipped"),
        "n_errors": sum(1 for r in records if r["status"] == "error"),
        "length_cutoff_rate": len(lengths) / len(scored) if scored else None,
        "mean_prompt_tokens": _mean([r["prompt_tokens"] for r in scored if r.get("prompt_tokens") is not None]),
        "mean_output_tokens": _mean([r["output_tokens"] for r in scored if r.get("output_tokens") is not None]),
    }


_SUFFIX = {"k": 1e3, "K": 1e3, "M": 1e6}


def _group_sort_key(label: str):
    """Numeric labels in numeric order ("8k" < "16k" < "1M", "depth=5" < "depth=50")."""
    name, eq, value = label.partition("=")
    if not eq:
        name, value = "", label
    text = value.rstrip("%")
    scale = _SUFFIX.get(text[-1:], 1.0) if text else 1.0
    try:
        return (name, 0, float(text.rstrip("kKM")) * scale, label)
    except ValueError:
        return (name, 1, 0.0, label)


def _pct(variant: float | None, baseline: float | None) -> float | None:
    if variant is None or baseline is None or baseline == 0:
        return None
    return 100.0 * variant / baseline


def paired_recovery(baseline: list[dict], variant: list[dict]) -> dict:
    """Recovery % = variant mean / baseline mean x 100 over (sample, repeat) pairs scored in both arms."""
    b = {(r["sample_id"], r["repeat"]): r for r in baseline if r["status"] == "ok"}
    v = {(r["sample_id"], r["repeat"]): r for r in variant if r["status"] == "ok"}
    pairs = sorted(set(b) & set(v))
    mismatched = [k for k in pairs if b[k]["prompt_hash"] != v[k]["prompt_hash"]]
    if mismatched:
        raise ValueError(
            f"{len(mismatched)} (sample, repeat) pairs have different prompts in the two arms (first: "
            f"{mismatched[0]}); recovery needs byte-identical prompts."
        )
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for k in pairs:
        for g in b[k].get("groups") or ():
            groups[g].append((b[k]["score"], v[k]["score"]))
    overall = _pct(_mean([v[k]["score"] for k in pairs]), _mean([b[k]["score"] for k in pairs]))
    return {
        "overall": overall,
        "by_group": {g: _pct(_mean([x[1] for x in xs]), _mean([x[0] for x in xs]))
                     for g, xs in sorted(groups.items(), key=lambda kv: _group_sort_key(kv[0]))},
        "n_pairs": len(pairs),
    }
