"""The noise floor: the variant's flips against its baseline next to a control arm's, and the excess.

A flip is a (sample, repeat) right in one arm and wrong in the other (right = score >= `right_at`, as in
the report's flip list). Both comparisons are made on the same (sample, repeat) keys: those all three
arms scored with the same prompt. Per key, D_v = 1 when the variant disagrees with the baseline and
D_c = 1 when the control does; the excess discordance is mean(D_v) - mean(D_c), a difference of two
proportions measured on the same units, so its interval is a paired one (`METHOD`, clustered by sample).

Flips have a direction: beside the excess flips, the excess *net loss* (issue 36) = the control's accuracy
minus the variant's on the same keys = (lost - gained of the variant) - (lost - gained of the control), per
record, with its paired CI; and the one-sided upper bound of the excess flip rate (how much more FP8 may flip
than the noise floor at one-sided level 1 - alpha / 2). A CI that covers 0 is *no evidence* of an excess,
not evidence of no effect: `reading` says so in words.
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
    # net loss: per key, control right minus variant right (difference_ci gives mean(second - first))
    net = [(k[0], float(v_ok), float(c_ok)) for k, (_, v_ok, c_ok) in zip(common, rows)]
    n_est, n_low, n_high = (x / 100.0 for x in difference_ci(net, level)) if rows else (math.nan,) * 3
    return {
        "n_pairs": len(rows), "right_at": right_at,
        "variant": _flip_counts([(b, v) for b, v, _ in rows]),
        "control": _flip_counts([(b, c) for b, _, c in rows]),
        "table": {"both": both, "variant_only": v_only, "control_only": c_only,
                  "neither": len(rows) - both - v_only - c_only},
        "excess_flip_rate": None if math.isnan(est) else est,
        "ci": None if math.isnan(est) else [low, high], "level": level, "method": METHOD,
        "not_in_all_three": len(v_keys.keys() ^ c_keys.keys()),
        "excess_net_loss": None if math.isnan(n_est) else n_est,
        "net_loss_ci": None if math.isnan(n_est) else [n_low, n_high],
        "excess_upper": None if math.isnan(est) else high,  # one-sided at 1 - (1 - level) / 2
        "reading": reading(None if math.isnan(est) else (est, low, high),
                           None if math.isnan(n_est) else (n_est, n_low, n_high), level),
    }


def reading(excess: tuple[float, float, float] | None, net: tuple[float, float, float] | None, level: float) -> str:
    """The excess and the net loss in words, with their direction; "no evidence", never "no effect"."""
    if excess is None:
        return "no (sample, repeat) scored in all three arms: nothing to compare"
    one_sided = f"{100 * (1 - (1 - level) / 2):g} %"
    e, lo, hi = excess
    if lo > 0:
        flips = f"the variant flips more than the control: {100 * lo:.1f} to {100 * hi:.1f} points more (CI above 0)"
    elif hi < 0:
        flips = f"the variant flips less than the control ({100 * -hi:.1f} to {100 * -lo:.1f} points fewer)"
    else:
        flips = (f"no evidence that the variant flips more than the control (the CI covers 0); it may flip up to"
                 f" {100 * hi:.1f} points more ({one_sided} one-sided bound): this is not evidence of no effect")
    if net is None:
        return flips
    n, nlo, nhi = net
    direction = "loses" if n > 0 else "gains" if n < 0 else "neither loses nor gains"
    sure = ("" if nlo > 0 or nhi < 0 else ", and the CI covers 0")
    return (f"{flips}; net, the variant {direction} {100 * abs(n):.1f} points against the control"
            f" ({100 * level:g} % CI of its net loss {100 * nlo:+.1f} to {100 * nhi:+.1f}{sure})")
