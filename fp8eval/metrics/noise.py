"""The noise floor: the variant's flips against its baseline next to a control arm's, and the excess.

A flip is a (sample, repeat) right in one arm and wrong in the other (right = score >= `right_at`, as in
the report's flip list). Both comparisons are made on the same (sample, repeat) keys: those all three
arms scored with the same prompt. Per key, D_v = 1 when the variant disagrees with the baseline and
D_c = 1 when the control does; the excess discordance is mean(D_v) - mean(D_c), a difference of two
proportions measured on the same units, so its interval is a paired one (`paired_diff_ci`).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Sequence

from fp8eval.metrics.pairing import pair_records

RIGHT_AT = 0.5  # the report's default (fp8eval.report.verdicts.Thresholds.right_at)
METHOD = ("Newcombe (1998) square-and-add Wilson score interval for the difference of paired proportions "
          "(method 10), each (sample, repeat) one pair")


def _z(level: float) -> float:
    """Two-sided normal quantile for `level`."""
    return NormalDist().inv_cdf(0.5 + level / 2.0)


def wilson(x: float, n: float, z: float) -> tuple[float, float]:
    """Wilson score interval of x successes in n trials at normal quantile z."""
    if n <= 0:
        return 0.0, 1.0
    p = x / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (0.0 if x <= 0 else max(0.0, centre - half)), (1.0 if x >= n else min(1.0, centre + half))


def square_and_add(p1: float, l1: float, u1: float, p2: float, l2: float, u2: float,
                   phi: float = 0.0) -> tuple[float, float]:
    """Newcombe's square-and-add interval of p1 - p2 from each proportion's own interval; `phi` is the
    correlation of the two estimates (0 for independent samples)."""
    d = p1 - p2
    low = d - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = d + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return max(-1.0, low), min(1.0, high)


def paired_diff_ci(both: int, first_only: int, second_only: int, neither: int,
                   level: float = 0.95) -> tuple[float, float, float]:
    """(estimate, low, high) of p_first - p_second from a paired 2x2 table (Newcombe 1998, method 10): Wilson
    intervals of both margins combined with their phi correlation (a positive ad - bc reduced by n/2). Never
    zero-width: with no events at all it still spans the rates n pairs cannot exclude."""
    n = both + first_only + second_only + neither
    if n <= 0:
        return math.nan, math.nan, math.nan
    z = _z(level)
    x1, x2 = both + first_only, both + second_only
    margins = x1 * (n - x1) * x2 * (n - x2)
    cross = both * neither - first_only * second_only
    # Newcombe's correction: a positive cross product shrinks by n/2 (never below 0), so a few concordant pairs
    # do not buy a narrower interval than the data support
    cross = max(cross - n / 2.0, 0.0) if cross > 0 else cross
    phi = cross / math.sqrt(margins) if margins > 0 else 0.0
    l1, u1 = wilson(x1, n, z)
    l2, u2 = wilson(x2, n, z)
    low, high = square_and_add(x1 / n, l1, u1, x2 / n, l2, u2, phi)
    return x1 / n - x2 / n, low, high


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
    est, low, high = paired_diff_ci(both, v_only, c_only, len(rows) - both - v_only - c_only, level)
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
