"""Two arms joined record by record, and their recovery.

A pair is keyed by (sample, repeat); it counts only when both arms scored it, and both records must have
the same prompt hash (the arms saw byte-identical prompts). Everything left out is counted by reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from fp8eval.core.errors import Fp8evalError
from fp8eval.metrics import stats
from fp8eval.metrics.groups import label_sort_key
from fp8eval.metrics.select import is_scored, record_key

EXCLUSION_REASONS = ("baseline_only", "variant_only", "skipped", "errors")


class PairingError(Fp8evalError):
    """Two arms cannot be compared record by record; the message says why and where."""


@dataclass
class PairedKey:
    sample_id: str
    repeat: int
    groups: tuple[str, ...]
    baseline: int | None  # index into the baseline sequence
    variant: int | None
    excluded: str  # "" when both arms scored it, else one of EXCLUSION_REASONS


@dataclass
class Paired:
    keys: list[PairedKey]  # every key of either arm, sorted
    excluded: dict[str, int] = field(default_factory=dict)

    @property
    def pairs(self) -> list[PairedKey]:
        """The keys both arms scored (not excluded)."""
        return [k for k in self.keys if not k.excluded]


def pair_records(baseline: Sequence[dict], variant: Sequence[dict],
                 where: Callable[[str, int], str] | None = None) -> Paired:
    """Join two arms' records (one per key: `select.one_per_key` first). Raises PairingError when a
    key's prompt hashes differ; `where(side, index)` names a record in that message (file:line)."""
    b = {record_key(r): i for i, r in enumerate(baseline)}
    v = {record_key(r): i for i, r in enumerate(variant)}
    both = sorted(b.keys() & v.keys())
    mismatched = [k for k in both if baseline[b[k]].get("prompt_hash") and variant[v[k]].get("prompt_hash")
                  and baseline[b[k]]["prompt_hash"] != variant[v[k]]["prompt_hash"]]
    if mismatched:
        shown = ", ".join(f"{s}#{r}" + (f" ({where('baseline', b[(s, r)])} vs {where('variant', v[(s, r)])})"
                                        if where else "") for s, r in mismatched[:5])
        raise PairingError(
            f"{len(mismatched)} of {len(both)} (sample, repeat) pairs have different prompt hashes in the two"
            f" arms, e.g. {shown}. The arms did not see the same prompts (another prompt template, tokenizer,"
            " data file or seed), so their scores cannot be compared record by record.")
    keys: list[PairedKey] = []
    excluded = dict.fromkeys(EXCLUSION_REASONS, 0)
    for k in sorted(b.keys() | v.keys()):
        bi, vi = b.get(k), v.get(k)
        src = baseline[bi] if bi is not None else variant[vi]
        if bi is None or vi is None:
            reason = "variant_only" if bi is None else "baseline_only"
        elif "skipped" in (baseline[bi].get("status"), variant[vi].get("status")):
            reason = "skipped"
        elif not (is_scored(baseline[bi]) and is_scored(variant[vi])):
            reason = "errors"
        else:
            reason = ""
        if reason:
            excluded[reason] += 1
        keys.append(PairedKey(k[0], k[1], tuple(src.get("groups") or ()), bi, vi, reason))
    return Paired(keys, excluded)


def recovery(baseline: Sequence[dict], variant: Sequence[dict], paired: Paired | None = None) -> dict:
    """Recovery % = sum of variant scores / sum of baseline scores x 100 over the scored pairs (the same
    as the ratio of the means: both arms have the same pairs), overall and per group label."""
    paired = paired if paired is not None else pair_records(baseline, variant)
    pairs = paired.pairs
    groups: dict[str, list[tuple[float, float]]] = {}
    for k in pairs:
        for g in k.groups:
            groups.setdefault(g, []).append((float(baseline[k.baseline]["score"]), float(variant[k.variant]["score"])))
    overall = [(float(baseline[k.baseline]["score"]), float(variant[k.variant]["score"])) for k in pairs]
    return {
        "overall": recovery_of(overall),
        "by_group": {g: recovery_of(xs) for g, xs in sorted(groups.items(), key=lambda kv: label_sort_key(kv[0]))},
        "n_pairs": len(pairs),
        "excluded": dict(paired.excluded),
    }


def value_recovery(baseline: float | None, variant: float | None) -> float | None:
    """Recovery % of one task metric that is not a mean of scores (MRCR's AUC): variant / baseline x 100;
    None when either arm lacks it or the baseline's is 0 (undefined)."""
    if baseline is None or variant is None:
        return None
    value = stats.recovery_pct(baseline, variant)
    return None if value != value else value  # NaN: a baseline of 0


def recovery_of(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Recovery % of (baseline score, variant score) pairs; None when there are none or the baseline
    scored nothing (undefined)."""
    if not pairs:
        return None
    value = stats.recovery_pct(sum(b for b, _ in pairs), sum(v for _, v in pairs))
    return None if value != value else value  # NaN: a baseline of 0
