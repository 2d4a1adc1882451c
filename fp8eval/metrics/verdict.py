"""Verdicts that know their own resolution: the gate on the recovery CI, the MDE, what would decide it.

Per task and per group label, from the paired records (`pairing.pair_records`): recovery with the CI of
`intervals.recovery_ci`, the difference in points with its CI, the minimum detectable drop of this run
(`detect.mde`: the least drop its own CI detects with the configured power, under a stated truth), and a
verdict:

- pass: the CI's lower end is at or above the gate, less `margin` (0 by default; non-inferiority at
  one-sided (1 - level) / 2 nominally: docs/statistics.md gives the level that holds, by simulation);
- fail: the CI's upper end is below the gate;
- inconclusive: otherwise; `more_samples` says how many more samples of the same give at least an 80 % (the
  configured power's) chance to decide it, `more_samples_chance` the simulated chance at that count, and
  `more_repeats` more repeats per sample by a normal approximation (no chance claimed);
- n/a: nothing paired, or a baseline that scored 0 (recovery undefined).

`decide` is the one rule: summary.json's `verdict` block, the terminal table, the report and the
sequential stop's last look all call it. Repeats that are the same answer again are collapsed first
(`intervals.collapse_repeats`): eight greedy repeats judge as one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

from fp8eval.metrics import detect, intervals, power
from fp8eval.metrics.groups import label_sort_key

Pairs = Sequence[tuple[str, float, float]]  # (cluster, baseline score, variant score), one per record
VERDICTS = ("pass", "fail", "inconclusive", "n/a")


@dataclass(frozen=True)
class GateSettings:
    gate: float = 95.0  # recovery % the variant must keep
    alpha: float = 0.05  # two-sided: the CI level is 1 - alpha
    power: float = 0.8  # of the MDE
    right_at: float = 0.5  # a record is "right" at this score (lost / gained counts)
    margin: float = 0.0  # recovery points the CI's lower end may reach below the gate for a pass (a user's choice)

    @property
    def level(self) -> float:
        """The CI level, 1 - alpha."""
        return 1.0 - self.alpha

    def check(self) -> "GateSettings":
        """self, or ValueError naming a setting out of range."""
        if not 0.0 < self.gate <= 100.0:
            raise ValueError(f"gate is a recovery % in (0, 100], got {self.gate}")
        if not 0.0 < self.alpha < 1.0 or not 0.0 < self.power < 1.0:
            raise ValueError(f"alpha and power lie strictly between 0 and 1, got {self.alpha}, {self.power}")
        intervals.check_right_at(self.right_at)
        if not 0.0 <= self.margin < self.gate:
            raise ValueError(f"margin is recovery points in [0, gate), got {self.margin}")
        return self


def decide(low: float | None, high: float | None, gate: float, margin: float = 0.0) -> str:
    """The one gate rule: pass / fail / inconclusive of a recovery CI (%) against the gate (n/a without a
    CI). pass: low >= gate - margin; fail: high < gate; else inconclusive. high None: unbounded."""
    if low is None or (isinstance(low, float) and math.isnan(low)):
        return "n/a"
    high = math.inf if high is None else high
    if math.isnan(high) or not (math.isfinite(low) or math.isfinite(high)):
        return "n/a"
    if low >= gate - margin:
        return "pass"
    if high < gate:
        return "fail"
    return "inconclusive"


def entry(pairs: Pairs, st: GateSettings, samples: int | None = None,
          sample_ids: Sequence[str] | None = None) -> dict:
    """One verdict entry (summary.json `verdict.overall` or `verdict.by_group.<label>`). `samples`: the
    distinct samples behind the pairs when clusters hold several (NIAH cells); default one per cluster.
    `sample_ids[i]`: the sample of pairs[i] (default its cluster), to collapse identical repeats."""
    n_records = len(pairs)
    n_samples = samples or len(_cluster_sizes(pairs))
    pairs = intervals.collapse_repeats(pairs, sample_ids)
    ci = intervals.recovery_ci(pairs, st.level, st.right_at)
    out = {"verdict": "n/a", "why": "", **_ci_fields(ci), "mde_pts": None, "mde_recovery_pts": None,
           "n_repeats": 0, "more_samples": None, "more_samples_chance": None, "more_repeats": None,
           "repeats_collapsed": 0 < len(pairs) < n_records}
    if not pairs:
        out["why"] = "no record was scored in both arms"
        return out
    base = sum(b for _, b, _ in pairs) / len(pairs)
    out["n_repeats"] = math.ceil(n_records / n_samples)
    if base <= 0:
        out["why"] = "the baseline scored 0, so recovery is undefined"
        return out
    var = run_variance(pairs) if ci.n_clusters >= 2 else None
    k = ci.n_pairs / ci.n_clusters
    if var is not None:
        m = run_mde(pairs, ci, var, st)
        out["mde_pts"] = None if m is None else round(100.0 * m, 3)
        out["mde_recovery_pts"] = None if m is None else round(100.0 * m / base, 3)
    verdict = decide(ci.low, ci.high, st.gate, st.margin)
    out["verdict"] = verdict
    if verdict == "inconclusive":
        more = _more(pairs, st, 1000.0, n_samples)
        if more is not None:
            out["more_samples"], out["more_samples_chance"] = more[0], round(more[1], 3)
        if var is not None and k >= 2:
            out["more_repeats"] = more_repeats(var, ci, base, k, st)
    out["why"] = explain(out, st)
    return out


def run_variance(pairs: Pairs) -> power.Variance:
    """The run's variance components, floored where its CI is (`intervals.floor_variance`): no score type
    and no pilot without a flip gets a variance of 0."""
    var = power.variance_from_pairs(pairs, "this run")
    m = intervals.cluster_moments(pairs)
    return power.Variance(var.omega2, var.sigma2_w, var.source, var.binary,
                          intervals.floor_variance(m.n, m.k, m.together))


def run_mde(pairs: Pairs, ci: intervals.RecoveryCI, var: power.Variance, st: GateSettings) -> float | None:
    """The MDE (score units) with the power it claims, under the truth `metrics.detect` states (the run's
    disagreements as noise, FP8 losing whole clusters at random): the least drop at which the verdict's CI
    ends below 100 % with probability `st.power`. Exact for binary one-per-cluster data without a flip, else
    seeded draws (`detect.mde`). None when not even a total loss is detected that often."""
    return detect.mde(pairs, st.level, st.power)


def _ci_fields(ci: intervals.RecoveryCI) -> dict:
    d = ci.as_dict()
    return {"recovery": d["point"], "ci_low": d["low"], "ci_high": d["high"], "ci_method": d["method"],
            "level": d["level"], "diff_pts": d["diff"], "diff_low_pts": d["diff_low"],
            "diff_high_pts": d["diff_high"], "n_pairs": d["n_pairs"], "n_clusters": d["n_clusters"],
            "lost": d["lost"], "gained": d["gained"]}


def _cluster_sizes(pairs: Pairs) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for c, _, _ in pairs:
        sizes[str(c)] = sizes.get(str(c), 0) + 1
    return sizes


def more_samples(pairs: Pairs, st: GateSettings, max_factor: float = 1000.0, n_samples: int | None = None) -> int | None:
    """How many more samples (clusters x their size) give the run's CI at least an 80 % (`st.power`) chance to
    leave the gate if every observed outcome kept its rate: the fewest, by bisection on the simulated chance.
    Binary one-per-cluster data: `DRAWS` fixed-seed draws of the added pairs at the observed rates
    (`decide_chance`). Otherwise: clusters drawn from the run's own (`detect.more_clusters`, seeded from the
    data), times the samples per cluster. None when even max_factor times the data does not decide (the
    estimate sits at the gate). `entry` also gives the chance at that count (`more_samples_chance`): one more
    sample can move it by several points when the outcome hardly varies (no flip: it jumps from 0 to 1)."""
    more = _more(pairs, st, max_factor, n_samples)
    return None if more is None else more[0]


def _more(pairs: Pairs, st: GateSettings, max_factor: float, n_samples: int | None) -> tuple[int, float] | None:
    """(more_samples, the simulated chance to decide with them), or None."""
    n_now = n_samples or len(_cluster_sizes(pairs))
    ci = intervals.recovery_ci(pairs, st.level, st.right_at)
    if ci.method == "bonett-price":
        table = (sum(1 for _, b, v in pairs if b == 1.0 and v == 1.0), ci.lost, ci.gained)
        top = int(n_now * (max_factor - 1))
        if decide_chance(table, len(pairs), top, st) < st.power:
            return None
        lo_m, hi_m = 0, top
        while hi_m - lo_m > max(1, hi_m // 200):
            mid = (lo_m + hi_m) // 2
            lo_m, hi_m = (mid, hi_m) if decide_chance(table, len(pairs), mid, st) < st.power else (lo_m, mid)
        hi_m = max(1, hi_m)
        return hi_m, decide_chance(table, len(pairs), hi_m, st)
    n_clusters = len(_cluster_sizes(pairs))
    more = detect.more_clusters(pairs, st.level, st.gate, st.margin, st.power, int(n_clusters * (max_factor - 1)))
    if more is None:
        return None
    return (max(1, math.ceil(more * n_now / n_clusters)),
            detect.decide_chance(pairs, more, st.level, st.gate, st.margin))


DRAWS = 4000  # draws behind a binary more_samples (its Monte Carlo error: about 0.6 points at 80 %)


def decide_chance(table: tuple[int, int, int], n: int, more: int, st: GateSettings) -> float:
    """P(the CI decides) when `more` pairs are added to a binary table (both, lost, gained of n pairs) at its
    own rates: DRAWS draws with a fixed seed (deterministic), each judged by the Bonett-Price CI and `decide`."""
    both, lost, gained = table
    probs = np.array([both, lost, gained, n - both - lost - gained], dtype=float) / n
    add = np.random.default_rng(20261204).multinomial(more, probs, size=DRAWS)
    b2, g2, l2 = both + add[:, 0], gained + add[:, 2], lost + add[:, 1]
    lo, hi = intervals.bonett_price_vec(b2, g2, l2, st.level)
    passing = np.flatnonzero(100 * lo >= st.gate - st.margin)  # only there can the exact bound change the verdict
    net, n2 = np.maximum(l2 - g2, 0), b2 + l2
    ok = np.zeros(len(lo), dtype=bool)
    ok[passing] = [intervals.one_way_passes(int(net[i]), int(n2[i]), (st.gate - st.margin) / 100.0, st.level)
                   for i in passing]
    return float(np.mean(ok | (100 * hi < st.gate)))


def more_repeats(var: power.Variance, ci: intervals.RecoveryCI, base: float, k: float, st: GateSettings) -> int | None:
    """More repeats per sample that give the configured power's chance to decide at the same samples: the k'
    whose (z_{1-alpha/2} + z_power) standard errors fit in the distance from the point difference to the gate. None when repeats alone
    cannot (the between-sample variance is too large) or the point sits at the gate."""
    margin = (st.gate / 100.0 - 1.0) * base  # the gate as a difference in score units
    dist = abs(ci.diff / 100.0 - margin)
    if dist <= 0 or ci.n_clusters < 2:
        return None
    z = power.z_sum(st.alpha, st.power)  # a normal approximation of an 80 % (the power's) chance; not simulated
    budget = ci.n_clusters * dist ** 2 / z ** 2
    if var.omega2 >= budget:
        return None
    need = math.ceil(var.sigma2_w / (budget - var.omega2)) if var.sigma2_w > 0 else None
    return None if need is None or need <= k else int(need - k)


def explain(e: dict, st: GateSettings) -> str:
    """The verdict in one sentence, with the CI, its method, the counts and the MDE."""
    def pct(x):
        return "inf" if x is None else f"{x:.1f}%"

    lv = f"{st.level * 100:g}%"
    ci = (f"recovery {pct(e['recovery'])} ({lv} CI {pct(e['ci_low'])} to {pct(e['ci_high'])}, {e['ci_method']};"
          f" {e['n_pairs']} pairs in {e['n_clusters']} clusters"
          f"{' (identical repeats counted once)' if e.get('repeats_collapsed') else ''},"
          f" {e['lost']} lost / {e['gained']} gained)")
    mde = (f"; MDE {e['mde_pts']:.1f} points" if e.get("mde_pts") is not None else
           f"; no drop is detected with probability {st.power * 100:g} % at this size (no MDE)"
           if e.get("n_clusters", 0) >= 2 and e.get("recovery") is not None else "")
    if e["verdict"] == "pass":
        return f"{ci}: the CI's lower end is at or above the {st.gate:g}% gate{mde}"
    if e["verdict"] == "fail":
        return f"{ci}: even the CI's upper end is below the {st.gate:g}% gate{mde}"
    need = ""
    if e.get("more_samples") is not None:
        need = more_sentence(e["more_samples"], e.get("more_samples_chance"), st.power)
    if e.get("more_repeats") is not None:
        need += ("; " if need else "") + (f"{e['more_repeats']} more repeats per sample might"
                                          f"{' too' if need else ' decide it'} (a normal approximation whose"
                                          " chance is not simulated)")
    need = need or "the estimate sits at the gate: no amount of the same data decides it"
    return f"{ci} straddles the {st.gate:g}% gate{mde}; {need}"


def more_sentence(more: int, chance: float | None, power: float = 0.8) -> str:
    """The more_samples claim in words, with the simulated chance at that count (the fewest reaching `power`)."""
    p = power if chance is None else chance
    return (f"about {more} more samples would decide it with probability {100 * p:.0f} % if the observed rates are"
            f" the truth (simulated; the fewest reaching {100 * power:g} %)")


def verdicts(pairs: Sequence[tuple], st: GateSettings) -> dict:
    """summary.json's `verdict`: settings, `overall` and `by_group` entries from paired records
    `(cluster, groups, baseline_score, variant_score[, sample_id])` (the sample id counts samples when a
    cluster holds several)."""
    st.check()
    overall = [(p[0], p[2], p[3]) for p in pairs]
    groups: dict[str, list[tuple[str, float, float]]] = {}
    ids: dict[str, set] = {"": set()}
    for p in pairs:
        sid = p[4] if len(p) > 4 else p[0]
        ids[""].add(sid)
        for g in p[1]:
            groups.setdefault(g, []).append((p[0], p[2], p[3]))
            ids.setdefault(g, set()).add(sid)
    sids: dict[str, list[str]] = {}
    for p in pairs:
        sid = str(p[4] if len(p) > 4 else p[0])
        sids.setdefault("", []).append(sid)
        for g in p[1]:
            sids.setdefault(g, []).append(sid)
    ver = {"settings": {**asdict(st), "level": st.level},
           "overall": entry(overall, st, len(ids[""]) or None, sids.get("")),
           "by_group": {g: entry(ps, st, len(ids[g]), sids[g]) for g, ps in sorted(groups.items(),
                                                                                 key=lambda kv: label_sort_key(kv[0]))}}
    ver["decision"] = {"verdict": ver["overall"]["verdict"], "by": "fixed-n CI", "why": ver["overall"]["why"]}
    return ver


def set_sequential_decision(ver: dict | None, seq: dict) -> None:
    """With stop=sequential the run's one decision is the sequential one (anytime-valid; the fixed-n CI over
    the samples sent is descriptive after optional stopping): written into `ver["decision"]`, which the
    terminal, summary.json and the report all read."""
    if not ver:
        return
    buckets = ", ".join(f"{b} {v['decision']} ({v['samples_sent']}/{v['samples_planned']})"
                        for b, v in (seq.get("buckets") or {}).items())
    ver["decision"] = {"verdict": seq["decision"], "by": "sequential",
                       "why": (f"the sequential test (stop=sequential) says {seq['decision']} after {seq['rounds']}"
                               f" round(s), {seq['samples_sent']} of {seq['samples_planned']} samples sent ({buckets});"
                               f" the fixed-n CI over the samples sent is descriptive: {ver['overall']['verdict']}")}


def records_to_pairs(baseline: Sequence[dict], variant: Sequence[dict], paired,
                     cluster_of: Callable[[str, tuple[str, ...]], str] | None = None
                     ) -> list[tuple[str, tuple[str, ...], float, float, str]]:
    """`verdicts()` input from two arms' records and their `pairing.Paired` (scored pairs only):
    (cluster, groups, baseline score, variant score, sample id)."""
    out = []
    for k in paired.pairs:
        c = cluster_of(k.sample_id, k.groups) if cluster_of is not None else k.sample_id
        out.append((str(c), tuple(k.groups), float(baseline[k.baseline]["score"]), float(variant[k.variant]["score"]),
                    str(k.sample_id)))
    return out
