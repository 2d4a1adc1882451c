"""Anytime-valid sequential stopping against the recovery gate (`stop=sequential`, docs/statistics.md).

The variant keeps the gate g (recovery >= g) exactly when the mean of the per-sample contrast

    x_j = mean over sample j's paired records of (variant - g * baseline),   x_j in [-g, 1],

is >= 0. Samples arrive in a fixed order (a seeded shuffle, so a rerun replays it). Two betting
e-processes test "mean <= 0" and "mean >= 0" (Waudby-Smith & Ramdas 2024, "Estimating means of bounded
random variables by betting", JRSS-B: the hedged capital process):

    K+_t = prod_{i<=t} (1 + l+_i x_i),     K-_t = prod_{i<=t} (1 - l-_i x_i)

with predictable bets l_i (they use only x_1..x_{i-1}): the growth-rate-adaptive choice
l = mu / (var + mu^2) of the running (prior-smoothed) mean and variance, capped at c / g (K+) and c (K-)
so no factor reaches 0. Under the null each is a nonnegative supermartingale, so by Ville's inequality
P(sup_t K >= 2 / alpha_cs) <= alpha_cs / 2 whatever the looks: pass when K+ crosses, fail when K- does.
The same bets at every candidate recovery R (x = v - R b) give the confidence sequence (`cs_bounds`).

A run also stops at n_max (the fixed-n size for alpha - alpha_cs and the planned power): there a
fixed-n CI at level 1 - (alpha - alpha_cs) (`intervals.recovery_ci`) decides or says inconclusive. By the
union bound the error rate over every look and the last one is <= alpha. n_max / n_fixed is
((z_{1-(alpha-alpha_cs)/2} + z_power) / (z_{1-alpha/2} + z_power))^2: 1.07 for alpha_cs = alpha / 5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from fp8eval.metrics import intervals, verdict

DECISIONS = ("pass", "fail", "continue", "inconclusive")


@dataclass(frozen=True)
class Design:
    gate: float = 95.0  # recovery %
    alpha: float = 0.05  # total error rate (both directions, every look and the last)
    alpha_cs: float = 0.01  # the share the anytime-valid part spends; the final look gets alpha - alpha_cs
    cap: float = 0.8  # bets at most cap / (largest loss per unit): no factor below 1 - cap
    prior_n: float = 2.0  # pseudo-observations at mean 0, variance prior_var, smoothing the first bets
    prior_var: float = 0.25

    def check(self) -> "Design":
        """self, or ValueError naming a setting out of range."""
        if not 0.0 < self.alpha_cs < self.alpha < 1.0:
            raise ValueError(f"need 0 < alpha_cs < alpha < 1, got alpha_cs={self.alpha_cs}, alpha={self.alpha}")
        if not 0.0 < self.cap < 1.0:
            raise ValueError(f"cap must lie in (0, 1), got {self.cap}")
        if not 0.0 < self.gate <= 100.0:
            raise ValueError(f"gate is a recovery % in (0, 100], got {self.gate}")
        return self

    @property
    def alpha_final(self) -> float:
        """The error rate the last look (at n_max) spends."""
        return self.alpha - self.alpha_cs


def log_capital(x: np.ndarray, g: float, design: Design) -> tuple[np.ndarray, np.ndarray]:
    """Running log K+ and log K- of contrasts x (shape (..., t), each in [-g, 1]), along the last axis."""
    x = np.asarray(x, dtype=float)
    t = x.shape[-1]
    csum = np.cumsum(x, axis=-1)
    csq = np.cumsum(x * x, axis=-1)
    zeros = np.zeros(x.shape[:-1] + (1,))
    prev_sum = np.concatenate([zeros, csum[..., :-1]], axis=-1)
    prev_sq = np.concatenate([zeros, csq[..., :-1]], axis=-1)
    count = np.arange(t, dtype=float) + design.prior_n
    mu = prev_sum / count
    var = np.maximum((prev_sq + design.prior_n * design.prior_var) / count - mu * mu, 1e-6)
    lam = mu / (var + mu * mu)
    lam_plus = np.clip(lam, 0.0, design.cap / g)
    lam_minus = np.clip(-lam, 0.0, design.cap / 1.0)
    return (np.cumsum(np.log1p(lam_plus * x), axis=-1), np.cumsum(np.log1p(-lam_minus * x), axis=-1))


def first_crossing(log_k: np.ndarray, threshold: float) -> np.ndarray:
    """Index (1-based count of samples) where log_k first reaches threshold, 0 where it never does."""
    hit = log_k >= threshold
    first = np.argmax(hit, axis=-1) + 1
    return np.where(hit.any(axis=-1), first, 0)


@dataclass(frozen=True)
class SequentialResult:
    decision: str  # pass | fail | continue (not decided, n_max not reached) | inconclusive (n_max, undecided)
    n_used: int  # samples whose records the decision needed
    n_seen: int  # samples in the data given
    e_pass: float  # final K+ (capped at 1e300)
    e_fail: float
    threshold: float  # 2 / alpha_cs
    how: str  # "confidence sequence" | "final look (n_max)" | ""

    def as_dict(self) -> dict:
        """JSON-ready fields."""
        return {"decision": self.decision, "n_used": self.n_used, "n_seen": self.n_seen,
                "e_pass": min(self.e_pass, 1e300), "e_fail": min(self.e_fail, 1e300),
                "threshold": self.threshold, "how": self.how}


def contrasts(samples: Sequence[Sequence[tuple[float, float]]], gate: float) -> np.ndarray:
    """x_j of each sample's paired records [(baseline, variant), ...] in the given order."""
    g = gate / 100.0
    return np.array([sum(v - g * b for b, v in recs) / len(recs) for recs in samples], dtype=float)


def decide(samples: Sequence[Sequence[tuple[float, float]]], design: Design, n_max: int,
           right_at: float = 0.5) -> SequentialResult:
    """The sequential decision after the samples seen so far (in their fixed order): a crossing of either
    e-process decides at its sample; otherwise at n_max the fixed-n CI at 1 - alpha_final decides or says
    inconclusive; before n_max it is `continue`. Deterministic: a rerun on the same records says the same."""
    design.check()
    thr = math.log(2.0 / design.alpha_cs)
    seen = list(samples)[:n_max] if n_max else list(samples)
    if not seen:
        return SequentialResult("continue", 0, 0, 1.0, 1.0, math.exp(thr), "")
    x = contrasts(seen, design.gate)
    lp, lm = log_capital(x, design.gate / 100.0, design)
    tp, tm = int(first_crossing(lp, thr)), int(first_crossing(lm, thr))
    e_p, e_m = math.exp(min(lp[-1], 690.0)), math.exp(min(lm[-1], 690.0))
    if tp or tm:
        first = min(t for t in (tp, tm) if t)
        decision = "pass" if first == tp else "fail"
        return SequentialResult(decision, first, len(seen), e_p, e_m, math.exp(thr), "confidence sequence")
    if len(seen) < n_max:
        return SequentialResult("continue", len(seen), len(seen), e_p, e_m, math.exp(thr), "")
    pairs = [(str(j), b, v) for j, recs in enumerate(seen) for b, v in recs]
    ci = intervals.recovery_ci(intervals.collapse_repeats(pairs), 1.0 - design.alpha_final, right_at)
    final = verdict.decide(ci.low, ci.high, design.gate)
    return SequentialResult(final, len(seen), len(seen), e_p, e_m, math.exp(thr), "final look (n_max)")


def cs_bounds(samples: Sequence[Sequence[tuple[float, float]]], design: Design,
              grid: Sequence[float] | None = None) -> tuple[float, float]:
    """The confidence sequence for recovery % at the last sample: every candidate R of the grid whose two
    e-processes (x = v - R b) both stay below 2 / alpha_cs. (nan, nan) with no sample; the grid's ends
    when the set reaches them."""
    if not samples:
        return math.nan, math.nan
    grid = np.asarray(grid if grid is not None else np.linspace(0.0, 200.0, 801), dtype=float)
    thr = math.log(2.0 / design.alpha_cs)
    xs = np.stack([contrasts(samples, r) for r in grid])  # (grid, t)
    inside = []
    for r, x in zip(grid, xs):
        lp, lm = log_capital(x, max(r / 100.0, 1e-9), design)
        inside.append(bool(lp.max() < thr and lm.max() < thr))
    keep = grid[np.array(inside)]
    if keep.size == 0:
        return math.nan, math.nan
    return float(keep.min()), float(keep.max())


def n_max_for(n_fixed: int, design: Design, power: float = 0.8) -> int:
    """n_max of a sequential run whose fixed-n counterpart needs n_fixed at alpha: the same power at the
    planned drop with alpha_final in place of alpha (normal approximation)."""
    z = intervals.z_quantile
    ratio = ((z(1 - design.alpha_final / 2) + z(power)) / (z(1 - design.alpha / 2) + z(power))) ** 2
    return max(2, math.ceil(n_fixed * ratio))
