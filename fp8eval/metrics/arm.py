"""One arm's numbers from its records: score, stderr, per-group scores, counts."""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

from fp8eval.metrics import stats, verdict
from fp8eval.metrics.groups import label_sort_key
from fp8eval.metrics.pairing import Paired, pair_records, recovery
from fp8eval.metrics.select import is_scored, one_per_key

__all__ = ["arm_summary", "group_numbers", "grouped", "mean_of", "paired_recovery", "paired_verdicts", "score_stderr"]


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


def group_numbers(records: Sequence[dict]) -> dict:
    """The numbers of one set of records (an arm, or one group or bucket of it), the same everywhere they are
    shown (summary.json, the report's tables, MRCR's buckets): `score` and `stderr` (`score_stderr`) and
    `length_cutoff_rate` over the scored records, `n_scored`, `n_samples`, `n_repeats` of them, and
    `n_skipped`, `n_errors` over all of them. Rates and scores are None when nothing is scored."""
    scored = [r for r in records if is_scored(r)]
    score, stderr = score_stderr(scored)
    return {
        "score": score,
        "stderr": stderr,
        "n_scored": len(scored),
        "n_samples": len({r.get("sample_id") for r in scored}),
        "n_repeats": len({r.get("repeat") for r in scored}),
        "n_skipped": sum(1 for r in records if r.get("status") == "skipped"),
        "n_errors": sum(1 for r in records if r.get("status") == "error"),
        "length_cutoff_rate": (sum(1 for r in scored if r.get("finish_reason") == "length") / len(scored)
                               if scored else None),
    }


def grouped(records: Sequence[dict], labels_of: Callable[[dict], Iterable[str]] | None = None) -> dict[str, dict]:
    """{label: group_numbers of the records carrying it}, in label order (`groups.label_sort_key`). A
    record's labels are its `groups` unless `labels_of(record)` says otherwise (MRCR: its bucket)."""
    labels_of = labels_of or (lambda r: r.get("groups") or ())
    members: dict[str, list[dict]] = {}
    for r in records:
        for g in labels_of(r):
            if g is not None:
                members.setdefault(g, []).append(r)
    return {g: group_numbers(rs) for g, rs in sorted(members.items(), key=lambda kv: label_sort_key(kv[0]))}


def arm_summary(records: Sequence[dict]) -> dict:
    """An arm's summary.json entry (less what the runner adds). Records should be one per key
    (`select`); duplicates are resolved here too, so the number never depends on it."""
    records, n_replaced = one_per_key(records)
    scored = [r for r in records if is_scored(r)]
    whole = group_numbers(records)
    out = {
        "score": whole["score"],
        "stderr": whole["stderr"],
        "n_samples": whole["n_samples"],
        "n_repeats": whole["n_repeats"],
        # groups with a scored record (a group of skipped records only has no score to show)
        "by_group": {g: n["score"] for g, n in grouped(records).items() if n["n_scored"]},
        "n_records": len(records),
        "n_scored": whole["n_scored"],
        "n_skipped": whole["n_skipped"],
        "n_errors": whole["n_errors"],
        "length_cutoff_rate": whole["length_cutoff_rate"],
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
