"""Power and resolution of a paired run: minimum detectable drop, samples and repeats needed.

Pure functions (docs/statistics.md derives every formula). The unit is a *cluster* (a sample, or the
samples that share a context: NIAH cells with several needles); a cluster holds k paired records
(repeats). The paired difference of cluster j is the mean over its records of variant - baseline score.

    Var(mean difference over n clusters) = (omega2 + sigma2_w / k) / n

omega2 = variance across clusters of their true mean differences, sigma2_w = variance of one record's
difference around its cluster's mean (Miller 2024, "Adding error bars to evals": the K-repeat term).
With a binary score a true drop of delta cannot come with less variance than one-way flips give,
delta (1 - delta) / k, so that is the floor of the variance under the alternative (`binary=True`).

    n = (z_{1-alpha/2} + z_{power})^2 * Var_1 / delta^2          (Miller's formula, Var_1 = n * Var(mean))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from fp8eval.metrics.intervals import t_quantile, z_quantile


@dataclass(frozen=True)
class Variance:
    """Variance components of paired per-record differences (score units, 0-1)."""

    omega2: float  # between clusters (of the cluster-mean differences, less the within part)
    sigma2_w: float  # within a cluster, across repeats
    source: str  # "pilot: ..." or "prior: ..."
    binary: bool = True  # scores are 0/1: the flip floor applies
    floor: float = 0.0  # least variance of one cluster's mean difference (the CI's floor, any score type)

    def per_cluster(self, k: float, delta: float = 0.0) -> float:
        """Variance of one cluster's mean difference with k repeats, floored by the CI's own floor and, for
        binary scores, by a drop delta's one-way flips."""
        v = max(self.omega2 + self.sigma2_w / k, self.floor)
        return max(v, flip_floor(delta, k)) if self.binary else v


def flip_floor(delta: float, k: float) -> float:
    """Least variance of a cluster-mean difference with k records when the mean drops by delta through
    one-way flips: delta (1 - delta) / k."""
    d = min(abs(delta), 1.0)
    return d * (1.0 - d) / k


def z_sum(alpha: float, power: float) -> float:
    """z_{1-alpha/2} + z_{power}: a two-sided test at alpha with the given power."""
    if not 0.0 < alpha < 1.0 or not 0.0 < power < 1.0:
        raise ValueError(f"alpha and power must lie strictly between 0 and 1, got {alpha}, {power}")
    return z_quantile(1.0 - alpha / 2.0) + z_quantile(power)


def t_sum(alpha: float, power: float, df: float) -> float:
    """t_{1-alpha/2, df} + t_{power, df}: z_sum with the small-sample t quantiles of the clustered CI."""
    z_sum(alpha, power)  # the range check
    return t_quantile(1.0 - alpha / 2.0, df) + t_quantile(power, df)


def mde(var: Variance, n: float, k: float, alpha: float = 0.05, power: float = 0.8, df: float | None = None) -> float:
    """Minimum detectable drop (score units) of n clusters x k repeats: the delta solving
    delta = z_sum * sqrt(Var(delta) / n) (t quantiles on df degrees of freedom when df is given: the
    clustered CI's own). Bisection (Var may grow with delta through the flip floor)."""
    if n <= 0 or k <= 0:
        return math.inf
    z = z_sum(alpha, power) if df is None else t_sum(alpha, power, df)

    def gap(d: float) -> float:
        return d - z * math.sqrt(var.per_cluster(k, d) / n)

    lo, hi = 0.0, 1.0
    if gap(hi) < 0:
        return 1.0  # nothing below a total loss is detectable
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if gap(mid) < 0:
            lo = mid
        else:
            hi = mid
    return hi


def clusters_needed(var: Variance, delta: float, k: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Clusters needed to detect a drop delta with k repeats each: ceil(z_sum^2 Var(delta) / delta^2)."""
    if delta <= 0:
        raise ValueError(f"the drop to detect must be > 0, got {delta}")
    return max(2, math.ceil(z_sum(alpha, power) ** 2 * var.per_cluster(k, delta) / delta ** 2))


def repeats_needed(var: Variance, delta: float, n: float, alpha: float = 0.05, power: float = 0.8,
                   k_max: int = 10_000) -> int | None:
    """Fewest repeats k that detect delta with n clusters; None when no k up to k_max does (the
    between-cluster variance alone is too large: add clusters instead)."""
    budget = n * delta ** 2 / z_sum(alpha, power) ** 2  # the largest per-cluster variance allowed
    if var.omega2 >= budget:
        return None
    need = var.sigma2_w / (budget - var.omega2)
    if var.binary:
        need = max(need, flip_floor(delta, 1.0) / budget)
    k = max(1, math.ceil(need - 1e-12))
    return k if k <= k_max else None


def variance_from_pairs(pairs: Sequence[tuple[str, float, float]], source: str) -> Variance:
    """Variance components from pilot records `(cluster, baseline_score, variant_score)`: sigma2_w = mean
    within-cluster variance of the per-record differences (clusters with 2+ records), omega2 = variance
    of the cluster means less sigma2_w / k (at least 0)."""
    clusters: dict[str, list[float]] = {}
    scores = []
    for c, b, v in pairs:
        clusters.setdefault(str(c), []).append(float(v) - float(b))
        scores += [float(b), float(v)]
    binary = all(s in (0.0, 1.0) for s in scores)
    if len(clusters) < 2:
        raise ValueError(f"a pilot needs paired records of at least 2 clusters, got {len(clusters)}")
    within = [_var(ds) for ds in clusters.values() if len(ds) > 1]
    sigma2_w = sum(within) / len(within) if within else 0.0
    means = [sum(ds) / len(ds) for ds in clusters.values()]
    k = sum(len(ds) for ds in clusters.values()) / len(clusters)
    omega2 = max(0.0, _var(means) - sigma2_w / k)
    return Variance(omega2, sigma2_w, source, binary)


def chi2_quantile(p: float, df: float) -> float:
    """Chi-square quantile by the Wilson-Hilferty cube (within about 1 % for df >= 3; enough for a range)."""
    z = z_quantile(p)
    c = 2.0 / (9.0 * df)
    return df * max(0.0, 1.0 - c + z * math.sqrt(c)) ** 3


def clopper_pearson(x: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval of a binomial proportion x / n, by bisection on the binomial tails."""
    a = (1.0 - level) / 2.0

    def upper_tail(p: float, x: int = x) -> float:  # P(X >= x), increasing in p
        return sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(x, n + 1))

    def solve(f, target: float) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
        return 0.5 * (lo + hi)

    low = 0.0 if x == 0 else solve(upper_tail, a)
    high = 1.0 if x == n else solve(lambda p: upper_tail(p, x + 1), 1.0 - a)  # P(X <= x) = a
    return low, high


def variance_range(pairs: Sequence[tuple[str, float, float]], level: float = 0.95) -> tuple[Variance, Variance]:
    """What a small pilot leaves uncertain: (low, high) variance components at `level`. Binary pairs, one per
    cluster: the discordance rate's exact interval (a record's difference has variance ~ its flip rate), so
    an all-ties pilot still ends high (9 ties: up to 0.34). Otherwise: the chi-square interval of the
    per-cluster variance (n - 1 df), scaled onto both components, with the CI's floor under the low end."""
    var = variance_from_pairs(pairs, "pilot")
    clusters = {str(c) for c, _, _ in pairs}
    n = len(clusters)
    if var.binary and n == len(pairs):
        flips = sum(1 for _, b, v in pairs if float(b) != float(v))
        lo, hi = clopper_pearson(flips, n, level)
        return (Variance(lo, 0.0, var.source + f" (low end, {level:.0%})", True),
                Variance(hi, 0.0, var.source + f" (high end, {level:.0%})", True))
    k = len(pairs) / n
    per = var.omega2 + var.sigma2_w / k
    floor = 2.0 / (n - 1)  # one whole cluster lost, one gained: nothing shows repeats to be independent
    base = max(per, floor / 4.0)
    f_lo = (n - 1) / chi2_quantile(0.5 + level / 2.0, n - 1)
    f_hi = (n - 1) / max(chi2_quantile(0.5 - level / 2.0, n - 1), 1e-9)
    scale = base / per if per > 0 else 1.0
    lo = Variance(var.omega2 * scale * f_lo, var.sigma2_w * scale * f_lo, var.source + " (low end)", var.binary)
    hi = Variance(var.omega2 * scale * f_hi if per > 0 else base * f_hi, var.sigma2_w * scale * f_hi,
                  var.source + " (high end)", var.binary)
    return lo, hi


def _var(xs: Sequence[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    m = sum(xs) / n
    return sum((x - m) ** 2 for x in xs) / (n - 1)


def trtllm_threshold(n: int, sigma: float = 50.0, alpha: float = 0.05, beta: float = 0.2) -> tuple[float, float]:
    """TensorRT-LLM's accuracy-test numbers for comparison: one-sided, unpaired against a stored
    reference, fixed n, scores on 0-100. Returns (theta, gamma_offset): the detectable drop
    theta = (z_{1-beta} - z_{alpha}) sqrt(2 sigma^2 / n) and the pass threshold's offset from the
    reference, gamma - ref = z_{alpha} sqrt(2 sigma^2 / n) (negative)."""
    scale = math.sqrt(2.0 * sigma ** 2 / n)
    return (z_quantile(1.0 - beta) - z_quantile(alpha)) * scale, z_quantile(alpha) * scale
