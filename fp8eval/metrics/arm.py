"""One arm's numbers from its records: score, stderr, per-group scores, counts."""

from __future__ import annotations

import math
from typing import Sequence

from fp8eval.metrics import stats, verdict
from fp8eval.metrics.groups import label_sort_key
from fp8eval.metrics.pairing import Paired, pair_records, recovery
from fp8eval.metrics.select import is_scored, one_per_key

__all__ = ["arm_summary", "mean_of", "paired_recovery", "paired_verdicts", "score_stderr"]


def mean_of(xs: Sequence[float]) -> float | None:
    """Plain mean in input order; None for no values."""
    return sum(xs) / len(xs) if xs else None


def score_stderr(records: Sequence[dict]) -> tuple[float | None, float | None]:
    """(mean pass@1, stderr) of scored records. The stderr rule (`stats.stderr_of_scores`): across the
    per-repeat means when there are several repeats (the spread a rerun would show), else across the
    per-sample scores; None when it is undefined (fewer than two values)."""
    scored = [r for r in records if is_scored(r)]
    if not scored:
        return None, None
    scores = [float(r["score"]) for r in scored]
    err = stats.stderr_of_scores([r.get("sample_id") for r in scored], [int(r.get("repeat", 0)) for r in scored], scores)
    return mean_of(scores), (None if math.isnan(err) else err)


def arm_summary(records: Sequence[dict]) -> dict:
    """An arm's summary.json entry (less what the runner adds). Records should be one per key
    (`select`); duplicates are resolved here too, so the number never depends on it."""
    records, n_replaced = one_per_key(records)
    scored = [r for r in records if is_scored(r)]
    score, stderr = score_stderr(scored)
    by_group: dict[str, list[dict]] = {}
    for r in scored:
        for g in r.get("groups") or ():
            by_group.setdefault(g, []).append(r)
    lengths = [r for r in scored if r.get("finish_reason") == "length"]
    out = {
        "score": score,
        "stderr": stderr,
        "n_samples": len({r["sample_id"] for r in scored}),
        "n_repeats": len({r["repeat"] for r in scored}),
        "by_group": {g: mean_of([float(r["score"]) for r in rs])
                     for g, rs in sorted(by_group.items(), key=lambda kv: label_sort_key(kv[0]))},
        "n_records": len(records),
        "n_scored": len(scored),
        "n_skipped": sum(1 for r in records if r["status"] == "skipped"),
        "n_errors": sum(1 for r in records if r["status"] == "error"),
        "length_cutoff_rate": len(lengths) / len(scored) if scored else None,
        "mean_prompt_tokens": mean_of([r["prompt_tokens"] for r in scored if r.get("prompt_tokens") is not None]),
        "mean_output_tokens": mean_of([r["output_tokens"] for r in scored if r.get("output_tokens") is not None]),
        "prefix_cache_hit_rate": _hit_rate(records),
    }
    if n_replaced:
        out["n_replaced"] = n_replaced
    return out


def _hit_rate(records: Sequence[dict]) -> float | None:
    """Share of prompt tokens the engine served from its prefix cache, over the records whose engine said
    (None when none did). The repeats of one request share one prefill whatever this says."""
    known = [r for r in records if r.get("cached_prompt_tokens") is not None and r.get("prompt_tokens")]
    total = sum(r["prompt_tokens"] for r in known)
    return sum(r["cached_prompt_tokens"] for r in known) / total if total else None


def paired_recovery(baseline: Sequence[dict], variant: Sequence[dict]) -> dict:
    """summary.json's `recovery`: overall and per-group recovery % over pairs scored in both arms."""
    baseline, _ = one_per_key(baseline)
    variant, _ = one_per_key(variant)
    paired: Paired = pair_records(baseline, variant)
    return recovery(baseline, variant, paired)


def paired_verdicts(baseline: Sequence[dict], variant: Sequence[dict], settings: verdict.GateSettings,
                    cluster_of=None) -> dict:
    """summary.json's `verdict`: the gate on the honest recovery CI, overall and per group, with the MDE
    and what more would decide it (`metrics.verdict`). `cluster_of(sample_id, groups)` names each record's
    cluster (the task's `cluster_of`; default the sample)."""
    baseline, _ = one_per_key(baseline)
    variant, _ = one_per_key(variant)
    paired = pair_records(baseline, variant)
    return verdict.verdicts(verdict.records_to_pairs(baseline, variant, paired, cluster_of), settings)
