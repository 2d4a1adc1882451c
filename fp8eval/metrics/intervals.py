"""Confidence intervals for recovery that stay honest with few pairs and no flips (docs/statistics.md).

Pure functions over counts and numbers; no I/O, no randomness. Two methods, chosen by the data:

- **binary** (every score 0 or 1, one paired record per cluster): the Bonett-Price hybrid Wilson score
  interval for the ratio of paired proportions, its lower end no higher than the exact one-way-loss bound
  (`one_way_low`: FP8 usually only loses answers, and there Bonett-Price alone passes too often) (Bonett & Price 2006; Fagerland, Lydersen & Laake 2017,
  "Statistical Analysis of Contingency Tables", ch. 8). It uses the discordant pairs and adds a pseudo
  count to each, so nine pairs without a flip give 76-131 %, not the bootstrap's 100-100 %. The
  difference in points comes with Newcombe's (1998) square-and-add score interval for paired proportions
  (his method 10).
- **clustered** (repeats, or scores between 0 and 1): Fieller's interval for the ratio of the arms' cluster
  totals with a t quantile (n_clusters - 1 df), the variance of the per-cluster differences floored at what
  one lost and one gained *flip event* would give, an event moving as many records of a cluster as the data
  show move together (`together`: all of them when no flip shows otherwise). Zero observed flips never make
  a zero-width interval, and repeats that move together buy no certainty (issue 36).

Repeats that are the same answer again (greedy decoding: every repeat of a sample scored the same in both
arms) are collapsed to one record before any of this (`collapse_repeats`): they carry no new information.

Recovery = variant / baseline x 100 everywhere (`stats.recovery_pct`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Sequence

_NORMAL = NormalDist()


# --- quantiles ----------------------------------------------------------------------------------------
def z_quantile(p: float) -> float:
    """Standard normal quantile Phi^-1(p) (z_quantile(0.975) = 1.959964...)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a probability strictly between 0 and 1 is needed, got {p}")
    return _NORMAL.inv_cdf(p)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def beta_inc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(ln) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student t distribution function with df degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    tail = 0.5 * beta_inc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Student t quantile (t_quantile(0.975, 8) = 2.306004...), by bisection on `t_cdf`."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a probability strictly between 0 and 1 is needed, got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# --- single and paired proportions ---------------------------------------------------------------------
def wilson(x: float, n: float, z: float) -> tuple[float, float]:
    """Wilson score interval for x successes of n at normal quantile z (no continuity correction)."""
    if n <= 0:
        return 0.0, 1.0
    p = x / n
    centre = (2 * x + z * z) / (2 * (n + z * z))
    half = z * math.sqrt(z * z + 4 * x * (1 - p)) / (2 * (n + z * z))
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_paired_diff(both: float, gained: float, lost: float, neither: float,
                         level: float = 0.95) -> tuple[float, float, float]:
    """(estimate, low, high) of p_variant - p_baseline from a paired 2x2 table: Newcombe's (1998)
    square-and-add Wilson score interval for paired proportions (his method 10, with the n/2 adjusted
    correlation). `gained` = right only in the variant, `lost` = right only in the baseline."""
    n = both + gained + lost + neither
    if n <= 0:
        return math.nan, math.nan, math.nan
    z = z_quantile(0.5 + level / 2.0)
    p1, p2 = (both + gained) / n, (both + lost) / n  # variant, baseline
    l1, u1 = wilson(both + gained, n, z)
    l2, u2 = wilson(both + lost, n, z)
    margins = (both + gained) * (lost + neither) * (both + lost) * (gained + neither)
    phi = 0.0
    if margins > 0:
        cross = both * neither - gained * lost
        adj = cross - n / 2.0 if cross > n / 2.0 else (cross if cross < 0 else 0.0)
        phi = adj / math.sqrt(margins)
    est = p1 - p2
    low = est - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = est + math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    return est, max(-1.0, low), min(1.0, high)


def bonett_price_ratio(both: float, gained: float, lost: float, level: float = 0.95) -> tuple[float, float, float]:
    """(estimate, low, high) of p_variant / p_baseline from a paired 2x2 table: the Bonett-Price (2006)
    hybrid Wilson score interval. Pairs wrong in both arms do not enter it. High is inf when nothing
    separates the baseline from 0."""
    n1, n2, nstar = both + gained, both + lost, both + gained + lost
    if nstar <= 0:
        return math.nan, 0.0, math.inf
    est = n1 / n2 if n2 > 0 else math.inf
    a = math.sqrt((gained + lost + 2.0) / ((n1 + 1.0) * (n2 + 1.0)))
    b = math.sqrt((1.0 - (n1 + 1.0) / (nstar + 2.0)) / (n1 + 1.0))
    c = math.sqrt((1.0 - (n2 + 1.0) / (nstar + 2.0)) / (n2 + 1.0))
    z = a / (b + c) * z_quantile(0.5 + level / 2.0)

    def limits(x: float) -> tuple[float, float]:
        root = z * math.sqrt(z * z + 4 * x * (1 - x / nstar))
        return (2 * x + z * z - root) / (2 * (nstar + z * z)), (2 * x + z * z + root) / (2 * (nstar + z * z))

    l1, u1 = limits(n1)
    l2, u2 = limits(n2)
    return est, l1 / u2 if u2 > 0 else 0.0, u1 / l2 if l2 > 0 else math.inf


@functools.lru_cache(maxsize=65536)
def one_way_low(lost: float, n_right: float, level: float = 0.95) -> float:
    """Exact lower end of recovery when the variant only loses: each of the baseline's n_right right answers
    is lost with probability q, recovery = 1 - q, and the Clopper-Pearson upper end of q from `lost` of
    n_right at one-sided (1 - level) / 2 gives 1 - q_high. The Bonett-Price lower end is below the gate
    too often in this case (its pass rate at the gate reached 8.6 % at n = 100, benchmarks/stats_sim.py);
    the binary CI's lower end is the smaller of the two, so pass is a one-sided (1 - level) / 2 test here."""
    if n_right <= 0:
        return 0.0
    if lost >= n_right:
        return 0.0
    a = (1.0 - level) / 2.0
    lo, hi = 0.0, 1.0  # P(Binomial(n_right, q) <= lost) = 1 - I_q(lost + 1, n_right - lost), falling in q
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if 1.0 - beta_inc(lost + 1.0, n_right - lost, mid) > a else (lo, mid)
    return 1.0 - hi


def cluster_one_way_low(clusters: dict[str, list[tuple[float, float]]], level: float = 0.95) -> float:
    """`one_way_low` over clusters when the variant only lost (no cluster gained on net): the share of its
    baseline each cluster lost counts as a (fractional) loss among the clusters the baseline scored in.
    Exact when FP8 loses whole questions (or cells), conservative otherwise; inf (no bound) once a cluster
    gained, where the Fieller interval alone judges. The t interval on such a skewed difference passed
    9 % of runs at the gate (120 questions x 8, benchmarks/stats_sim.py)."""
    shares, n = 0.0, 0
    for recs in clusters.values():
        b, v = sum(x for x, _ in recs), sum(y for _, y in recs)
        if v > b + 1e-12:
            return math.inf
        if b > 0:
            shares += (b - v) / b
            n += 1
    return one_way_low(shares, n, level) if n else math.inf


def one_way_passes(lost: float, n_right: float, gate: float, level: float = 0.95) -> bool:
    """Whether `one_way_low(lost, n_right, level) >= gate` (gate a fraction), with one binomial tail instead of a
    bisection: P(Binomial(n_right, 1 - gate) <= lost) <= (1 - level) / 2."""
    if n_right <= 0 or lost >= n_right:
        return False
    q0 = 1.0 - gate
    if q0 <= 0:
        return False
    return 1.0 - beta_inc(lost + 1.0, n_right - lost, q0) <= (1.0 - level) / 2.0


def bonett_price_vec(both, gained, lost, level: float = 0.95):
    """`bonett_price_ratio`'s (low, high) over arrays of tables (numpy), for the chance computations."""
    import numpy as np

    both, gained, lost = (np.asarray(x, dtype=float) for x in (both, gained, lost))
    n1, n2, ns = both + gained, both + lost, both + gained + lost
    a = np.sqrt((gained + lost + 2.0) / ((n1 + 1.0) * (n2 + 1.0)))
    b = np.sqrt(np.maximum(1.0 - (n1 + 1.0) / (ns + 2.0), 0.0) / (n1 + 1.0))
    c = np.sqrt(np.maximum(1.0 - (n2 + 1.0) / (ns + 2.0), 0.0) / (n2 + 1.0))
    z = a / (b + c) * z_quantile(0.5 + level / 2.0)

    def lim(x, sign):
        root = z * np.sqrt(z * z + 4 * x * (1 - x / np.maximum(ns, 1.0)))
        return (2 * x + z * z + sign * root) / (2 * (ns + z * z))

    l1, u1, l2, u2 = lim(n1, -1), lim(n1, 1), lim(n2, -1), lim(n2, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(u2 > 0, l1 / u2, 0.0), np.where(l2 > 0, u1 / l2, np.inf)


# --- clustered (repeats, non-binary scores) ------------------------------------------------------------
@dataclass(frozen=True)
class ClusterMoments:
    """Per-record moments of n clusters (each cluster's sums divided by the mean cluster size k)."""

    n: int
    k: float
    mb: float  # mean baseline
    md: float  # mean difference (variant - baseline)
    sbb: float  # variance of the baseline
    sdd: float  # variance of the difference (unfloored)
    sdb: float  # covariance of difference and baseline
    together: float = 1.0  # records of a cluster that move as one flip event (1 .. k; `together`)


def together(clusters: Sequence[Sequence[float]]) -> float:
    """How many records of a cluster move together when one flips: 1 + (k0 - 1) rho, rho the intra-cluster
    correlation of the per-record differences (one-way ANOVA estimator, clipped to [0, 1]), k0 the ANOVA's
    mean cluster size. With no variance at all (no flip) nothing shows the records to be independent, so
    all k0 of them are assumed to move together (rho = 1)."""
    sizes = [len(c) for c in clusters if len(c)]
    n, big_n = len(sizes), sum(sizes)
    if n < 2 or big_n <= n:
        return 1.0 if big_n <= n else float(big_n) / n
    k0 = (big_n - sum(s * s for s in sizes) / big_n) / (n - 1)
    grand = sum(sum(c) for c in clusters) / big_n
    means = [sum(c) / len(c) for c in clusters if len(c)]
    msb = sum(s * (m - grand) ** 2 for s, m in zip(sizes, means)) / (n - 1)
    msw = sum((x - m) ** 2 for c, m in zip((c for c in clusters if len(c)), means) for x in c) / (big_n - n)
    denom = msb + (k0 - 1.0) * msw
    rho = 1.0 if denom <= 1e-15 else min(1.0, max(0.0, (msb - msw) / denom))
    return 1.0 + (k0 - 1.0) * rho


def collapse_repeats(pairs: Sequence[tuple], sample_of: Sequence[str] | None = None) -> list[tuple[str, float, float]]:
    """Paired records `(cluster, baseline, variant)` with each sample's repeats collapsed to one record when
    *every* sample's repeats are the same pair of scores (greedy decoding answers the same again: a repeat
    then adds no information, and identical repeats must leave the CI and the MDE as at one repeat).
    `sample_of[i]` names the sample of pairs[i] (default: its cluster). Unchanged otherwise."""
    sample_of = list(sample_of) if sample_of is not None else [str(p[0]) for p in pairs]
    seen: dict[str, tuple[str, float, float]] = {}
    for (c, b, v), s in zip(pairs, sample_of):
        first = seen.setdefault(str(s), (str(c), float(b), float(v)))
        if (first[1], first[2]) != (float(b), float(v)):
            return [(str(c), float(b), float(v)) for c, b, v in pairs]
    return list(seen.values()) if len(seen) < len(pairs) else [(str(c), float(b), float(v)) for c, b, v in pairs]


def cluster_moments(pairs: Sequence[tuple[str, float, float]]) -> ClusterMoments:
    """Moments of the per-cluster sums of paired records `(cluster, baseline, variant)`."""
    clusters: dict[str, list[float]] = {}
    diffs: dict[str, list[float]] = {}
    for c, b, v in pairs:
        acc = clusters.setdefault(str(c), [0.0, 0.0, 0.0])
        acc[0] += float(b)
        acc[1] += float(v)
        acc[2] += 1
        diffs.setdefault(str(c), []).append(float(v) - float(b))
    n = len(clusters)
    if n == 0:
        raise ValueError("cluster_moments needs at least one pair")
    k = sum(a[2] for a in clusters.values()) / n
    b = [a[0] / k for a in clusters.values()]
    d = [(a[1] - a[0]) / k for a in clusters.values()]
    mb, md = sum(b) / n, sum(d) / n
    m = min(k, together(list(diffs.values())))
    if n < 2:
        return ClusterMoments(n, k, mb, md, 0.0, 0.0, 0.0, m)
    return ClusterMoments(n, k, mb, md, sum((x - mb) ** 2 for x in b) / (n - 1),
                          sum((x - md) ** 2 for x in d) / (n - 1),
                          sum((x - md) * (y - mb) for x, y in zip(d, b)) / (n - 1), m)


def fieller_from_moments(m: ClusterMoments, level: float = 0.95, scale: float = 1.0) -> tuple[float, float]:
    """(low, high) of the ratio variant / baseline: Fieller's interval, t quantile on n - 1 df, the
    difference variance floored at `floor_variance`. `scale` pretends every cluster appeared that many
    times (same moments, n x scale clusters): what more of the same data would give. high is inf when
    the baseline's own interval reaches 0 (the set is unbounded)."""
    n = m.n * scale
    if n < 2:
        return 0.0, math.inf
    sdd = max(m.sdd, floor_variance(n, m.k, m.together))
    t2 = t_quantile(0.5 + level / 2.0, n - 1) ** 2 / n
    # R in the set iff (mv - R mb)^2 <= t2 Var(v - R b); with e = R - 1, v - R b = d - e b:
    # (md - e mb)^2 <= t2 (sdd - 2 e sdb + e^2 sbb)  ->  qa e^2 - 2 qb e + qc <= 0
    qa = m.mb * m.mb - t2 * m.sbb
    qb = m.md * m.mb - t2 * m.sdb
    qc = m.md * m.md - t2 * sdd
    disc = qb * qb - qa * qc
    if qa <= 0 or disc < 0:
        return 0.0, math.inf
    root = math.sqrt(disc)
    return max(0.0, 1.0 + (qb - root) / qa), 1.0 + (qb + root) / qa


def floor_variance(n_clusters: float, mean_cluster_size: float, together: float = 1.0) -> float:
    """Variance of the per-cluster mean differences if one flip event had lost `together` records of one
    cluster, one had gained as many in another, and nothing else moved: 2 (m / k)^2 / (n - 1) for n
    clusters of k records, m = together (1: one record; k: the whole cluster, what repeats that move
    together or a cell's needles on one haystack give). The floor that keeps an interval from zero width
    when no flip was seen, and repeats from buying certainty they do not carry."""
    if n_clusters < 2:
        return math.inf
    return 2.0 * (min(together, mean_cluster_size) / mean_cluster_size) ** 2 / (n_clusters - 1)


# --- the dispatcher -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RecoveryCI:
    point: float  # recovery %
    low: float  # recovery % (0 or more)
    high: float  # recovery % (inf when unbounded)
    level: float
    method: str  # "bonett-price" | "fieller-clustered"
    diff: float  # variant - baseline, points of score (0-100)
    diff_low: float
    diff_high: float
    n_pairs: int
    n_clusters: int
    lost: int  # records right (>= right_at) in the baseline only
    gained: int

    def as_dict(self) -> dict:
        """The fields as a JSON-ready dict (inf and NaN as None)."""
        return {k: (None if isinstance(x, float) and not math.isfinite(x) else x) for k, x in asdict(self).items()}


def check_right_at(right_at: float) -> float:
    """right_at, or ValueError: a record is "right" at a score in (0, 1]; 0 calls every record right (no flip can
    be seen) and above 1 none, so lost / gained and the binary interval would contradict the scores."""
    if not (isinstance(right_at, (int, float)) and 0.0 < right_at <= 1.0):
        raise ValueError(f"right_at is a score in (0, 1] (a record at or above it is right), got {right_at}")
    return float(right_at)


def is_binary(scores: Sequence[float]) -> bool:
    """Every score is exactly 0 or 1."""
    return all(s in (0.0, 1.0) for s in scores)


def recovery_ci(pairs: Sequence[tuple[str, float, float]], level: float = 0.95,
                right_at: float = 0.5) -> RecoveryCI:
    """The recovery CI of paired records `(cluster, baseline_score, variant_score)`: Bonett-Price when the
    scores are binary and every cluster holds one pair, else clustered Fieller (module docstring)."""
    check_right_at(right_at)
    if not pairs:
        nan = math.nan
        return RecoveryCI(nan, nan, nan, level, "none", nan, nan, nan, 0, 0, 0, 0)
    clusters: dict[str, list[tuple[float, float]]] = {}
    for c, b, v in pairs:
        clusters.setdefault(str(c), []).append((float(b), float(v)))
    lost = sum(1 for _, b, v in pairs if b >= right_at > v)
    gained = sum(1 for _, b, v in pairs if v >= right_at > b)
    scores = [float(x) for _, b, v in pairs for x in (b, v)]
    n = len(pairs)
    if is_binary(scores) and len(clusters) == n:
        both = sum(1 for _, b, v in pairs if b == 1.0 and v == 1.0)
        neither = n - both - lost - gained
        est, lo, hi = bonett_price_ratio(both, gained, lost, level)
        lo = min(lo, one_way_low(max(lost - gained, 0), both + lost, level))  # exact when FP8 only loses
        d, dlo, dhi = newcombe_paired_diff(both, gained, lost, neither, level)
        return RecoveryCI(_pct(est), _pct(lo), _pct(hi), level, "bonett-price", 100 * d, 100 * dlo, 100 * dhi,
                          n, n, lost, gained)
    m = cluster_moments(pairs)
    lo, hi = fieller_from_moments(m, level)
    if is_binary(scores):  # whole questions lost; a fractional share of a graded score is no binomial count
        lo = min(lo, cluster_one_way_low(clusters, level))
    est = (m.mb + m.md) / m.mb if m.mb > 0 else math.nan
    half = (t_quantile(0.5 + level / 2.0, m.n - 1) * math.sqrt(max(m.sdd, floor_variance(m.n, m.k, m.together)) / m.n)
            if m.n > 1 else math.inf)
    return RecoveryCI(_pct(est), _pct(lo), _pct(hi), level, "fieller-clustered", 100 * m.md, 100 * (m.md - half),
                      100 * (m.md + half), n, m.n, lost, gained)


def _pct(x: float) -> float:
    return 100.0 * x if math.isfinite(x) else x


def difference_ci(pairs: Sequence[tuple[str, float, float]], level: float = 0.95) -> tuple[float, float, float]:
    """(estimate, low, high) in points of score of mean(second - first) over paired records
    `(cluster, first, second)`: Newcombe's interval for binary one-per-cluster data, else the clustered t
    interval with the one-flip floor (`recovery_ci`'s difference). For an excess over a control arm, pass
    (cluster, control score, variant score): the variant's drop beyond the control's, with its CI."""
    ci = recovery_ci(pairs, level)
    return ci.diff, ci.diff_low, ci.diff_high
