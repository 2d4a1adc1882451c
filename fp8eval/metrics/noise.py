"""The noise floor: the variant's flips against its baseline next to a control arm's, and the excess.

A flip is a (sample, repeat) right in one arm and wrong in the other (right = score >= `right_at`, as in
the report's flip list). Both comparisons are made on the same (sample, repeat) keys: those all three
arms scored with the same prompt. Per key, D_v = 1 when the variant disagrees with the baseline and
D_c = 1 when the control does; the excess discordance is mean(D_v) - mean(D_c), a difference of two
proportions measured on the same units, so its interval is a paired one (`METHOD`, clustered by sample).
"""

from __future__ import annotations

import math
from typing import Sequence

from fp8eval.metrics.intervals import difference_ci
from fp8eval.metrics.pairing import pair_records

RIGHT_AT = 0.5  # the report's default (fp8eval.report.verdicts.Thresholds.right_at)
METHOD = ("fp8eval.metrics.intervals.difference_ci over per-(sample, repeat) discordance: Newcombe's (1998) paired "
          "score interval when every sample has one repeat, else the clustered t interval with the one-flip floor")


def _flip_counts(pairs: list[tuple[bool, bool]]) -> dict:
    lost = sum(1 for b, o in pairs if b and not o)
    gained = sum(1 for b, o in pairs if o and not b)
    n = len(pairs)
    return {"lost": lost, "gained": gained, "flips": lost + gained,
            "rate": (lost + gained) / n if n else None}


def control_comparison(baseline: Sequence[dict], variant: Sequence[dict], control: Sequence[dict],
                       right_at: float = RIGHT_AT, level: float = 0.95) -> dict:
    """The variant's and the control's flips against the baseline on the keys all three scored, and the
    excess flip rate of the variant over the control with its paired CI (`METHOD`)."""
    pv = pair_records(baseline, variant)
    pc = pair_records(baseline, control)
    v_keys = {(k.sample_id, k.repeat): k for k in pv.pairs}
    c_keys = {(k.sample_id, k.repeat): k for k in pc.pairs}
    common = sorted(v_keys.keys() & c_keys.keys())
    right = lambda rec: float(rec["score"]) >= right_at  # noqa: E731
    rows = []
    for key in common:
        b = right(baseline[v_keys[key].baseline])
        rows.append((b, right(variant[v_keys[key].variant]), right(control[c_keys[key].variant])))
    dv = [b != v for b, v, _ in rows]
    dc = [b != c for b, _, c in rows]
    both = sum(1 for x, y in zip(dv, dc) if x and y)
    v_only = sum(1 for x, y in zip(dv, dc) if x and not y)
    c_only = sum(1 for x, y in zip(dv, dc) if y and not x)
    # the one call site of the interval: (cluster = sample, first = the control's discordance, second = the variant's)
    est, low, high = (x / 100.0 for x in difference_ci([(k[0], float(c), float(v)) for k, v, c in zip(common, dv, dc)],
                                                      level))
    return {
        "n_pairs": len(rows), "right_at": right_at,
        "variant": _flip_counts([(b, v) for b, v, _ in rows]),
        "control": _flip_counts([(b, c) for b, _, c in rows]),
        "table": {"both": both, "variant_only": v_only, "control_only": c_only,
                  "neither": len(rows) - both - v_only - c_only},
        "excess_flip_rate": None if math.isnan(est) else est,
        "ci": None if math.isnan(est) else [low, high], "level": level, "method": METHOD,
        "not_in_all_three": len(v_keys.keys() ^ c_keys.keys()),
    }
