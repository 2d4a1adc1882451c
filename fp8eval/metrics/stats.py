"""Paired statistics for recovery: bootstrap CIs, the exact sign test, standard errors.

Pure functions over numpy arrays; no I/O, no global RNG. The unit of resampling is a *sample*: all of
its repeats move together, and the baseline and the variant move together (the pairing is what makes
the CI tight: both arms saw the same prompt and the same per-(sample, repeat) seed).

Inputs are per-sample *sums* of scores over that sample's paired repeats. Because both arms have the
same repeats of the same samples, mean(variant) / mean(baseline) over records equals
sum(variant) / sum(baseline), so the counts cancel and a sample with a missing repeat keeps its true
weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

# Bootstrap draws are made in blocks so a 10k-sample bucket never allocates n_boot × n at once.
_BLOCK_CELLS = 4_000_000


@dataclass(frozen=True)
class BootstrapCI:
    point: float  # the statistic on the observed data
    low: float
    high: float
    level: float
    n_boot: int  # replicates drawn
    n_undefined: int  # replicates whose statistic was undefined (baseline sum 0) and were dropped


def recovery_pct(baseline_sum: float, variant_sum: float) -> float:
    """variant / baseline × 100; NaN when the baseline scored nothing (recovery is undefined)."""
    if baseline_sum == 0:
        return math.nan
    return 100.0 * variant_sum / baseline_sum


def _check_paired(b: np.ndarray, v: np.ndarray) -> None:
    if b.shape != v.shape or b.ndim != 1:
        raise ValueError(f"paired arrays must be 1-D and the same length, got {b.shape} and {v.shape}")


def _percentile_ci(reps: np.ndarray, point: float, level: float, n_boot: int) -> BootstrapCI:
    ok = reps[np.isfinite(reps)]
    if ok.size == 0 or not math.isfinite(point):
        return BootstrapCI(point, math.nan, math.nan, level, n_boot, int(reps.size - ok.size))
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(ok, [alpha, 1.0 - alpha])
    return BootstrapCI(point, float(low), float(high), level, n_boot, int(reps.size - ok.size))


def paired_bootstrap_recovery(
    baseline_sums: Sequence[float],
    variant_sums: Sequence[float],
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> BootstrapCI:
    """Percentile CI of recovery % = sum(variant) / sum(baseline) × 100, resampling samples.

    `baseline_sums[i]` and `variant_sums[i]` are sample i's scores summed over its paired repeats.
    """
    b = np.asarray(baseline_sums, dtype=float)
    v = np.asarray(variant_sums, dtype=float)
    _check_paired(b, v)
    point = recovery_pct(float(b.sum()), float(v.sum()))
    n = b.size
    if n == 0:
        return BootstrapCI(math.nan, math.nan, math.nan, level, 0, 0)
    rng = np.random.default_rng(seed)
    reps = np.empty(n_boot, dtype=float)
    block = max(1, _BLOCK_CELLS // n)
    for start in range(0, n_boot, block):
        stop = min(n_boot, start + block)
        idx = rng.integers(0, n, size=(stop - start, n))
        bs = b[idx].sum(axis=1)
        vs = v[idx].sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            reps[start:stop] = np.where(bs > 0, 100.0 * vs / np.where(bs > 0, bs, 1.0), np.nan)
    return _percentile_ci(reps, point, level, n_boot)


def stratified_paired_bootstrap(
    baseline_sums: Sequence[float],
    variant_sums: Sequence[float],
    counts: Sequence[float],
    strata: Sequence[object],
    statistic: Callable[[dict, dict], float],
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> BootstrapCI:
    """Percentile CI of a statistic of per-stratum means, resampling samples within each stratum.

    For metrics built from bucket scores (MRCR's AUC): each bucket keeps its sample count, as in the
    real design, and `statistic(baseline_means, variant_means)` gets {stratum: mean score} per arm.
    `counts[i]` is the number of paired records summed in sample i.
    """
    b = np.asarray(baseline_sums, dtype=float)
    v = np.asarray(variant_sums, dtype=float)
    c = np.asarray(counts, dtype=float)
    _check_paired(b, v)
    _check_paired(b, c)
    keys = list(dict.fromkeys(strata))  # first-seen order, deterministic
    labels = np.array([keys.index(s) for s in strata], dtype=int)
    members = [np.flatnonzero(labels == k) for k in range(len(keys))]

    def means(arr: np.ndarray) -> dict:
        return {k: float(arr[m].sum() / c[m].sum()) for k, m in zip(keys, members)}

    if b.size == 0:
        return BootstrapCI(math.nan, math.nan, math.nan, level, 0, 0)
    try:
        point = float(statistic(means(b), means(v)))
    except ZeroDivisionError:  # e.g. a baseline AUC of 0: recovery is undefined
        return BootstrapCI(math.nan, math.nan, math.nan, level, 0, 0)
    if b.size == 0:
        return BootstrapCI(math.nan, math.nan, math.nan, level, 0, 0)
    rng = np.random.default_rng(seed)
    # Per stratum, all replicates at once: (n_boot,) arrays of resampled means.
    b_reps, v_reps = [], []
    for m in members:
        idx = m[rng.integers(0, m.size, size=(n_boot, m.size))]
        cs = c[idx].sum(axis=1)
        b_reps.append(b[idx].sum(axis=1) / cs)
        v_reps.append(v[idx].sum(axis=1) / cs)
    reps = np.empty(n_boot, dtype=float)
    for r in range(n_boot):
        try:
            reps[r] = statistic({k: float(x[r]) for k, x in zip(keys, b_reps)},
                                {k: float(x[r]) for k, x in zip(keys, v_reps)})
        except ZeroDivisionError:
            reps[r] = math.nan
    return _percentile_ci(reps, point, level, n_boot)


def sign_test(n_below: int, n_above: int) -> float:
    """One-sided exact sign test: P(X >= n_below) for X ~ Binomial(n_below + n_above, 1/2).

    Small when the variant is below the baseline in more units (buckets, tasks) than chance allows.
    Ties are left out by the caller, as the sign test requires. 1.0 when there is nothing to test.
    """
    if n_below < 0 or n_above < 0:
        raise ValueError("counts must be >= 0")
    n = n_below + n_above
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(n_below, n + 1))
    return tail / 2**n


def sign_test_two_sided(n_below: int, n_above: int) -> float:
    """Two-sided exact sign test p-value: twice the one-sided tail of the larger count, capped at 1 (1.0 with nothing to
    test)."""
    n = n_below + n_above
    if n == 0:
        return 1.0
    k = max(n_below, n_above)
    return min(1.0, 2.0 * sign_test(k, n - k))


def min_units_for_sign_test(alpha: float) -> int:
    """Fewest units with which a unanimous sign test can reach p <= alpha (5 for alpha = 0.05)."""
    n = 1
    while 0.5**n > alpha:
        n += 1
    return n


def stderr_mean(values: Sequence[float]) -> float:
    """Standard error of the mean with the n-1 standard deviation; NaN for fewer than 2 values."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return math.nan
    return float(x.std(ddof=1) / math.sqrt(x.size))


def stderr_of_scores(sample_ids: Sequence[str], repeats: Sequence[int], scores: Sequence[float]) -> float:
    """The harness's stderr rule (docs/ARCHITECTURE.md): across the per-repeat means when there is more
    than one repeat, else across the per-sample scores."""
    rep = np.asarray(repeats)
    sc = np.asarray(scores, dtype=float)
    distinct = np.unique(rep)
    if distinct.size > 1:
        return stderr_mean([float(sc[rep == r].mean()) for r in distinct])
    return stderr_mean(sc)


def paired_diff_z(baseline_sums: Sequence[float], variant_sums: Sequence[float],
                  counts: Sequence[float]) -> tuple[float, float]:
    """Mean per-record difference (variant - baseline) and its standard error over samples.

    Used to say whether one bucket's gap is inside its own error band.
    """
    b = np.asarray(baseline_sums, dtype=float)
    v = np.asarray(variant_sums, dtype=float)
    c = np.asarray(counts, dtype=float)
    if c.sum() == 0:
        return math.nan, math.nan
    diff = float((v.sum() - b.sum()) / c.sum())
    per_sample = (v - b) / c
    # Weighting by count is nearly always uniform (same repeats everywhere); the plain stderr of the
    # per-sample differences is then exact.
    return diff, stderr_mean(per_sample)
