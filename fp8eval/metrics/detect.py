"""The MDE with a stated truth behind it: the drop a run's own CI and gate rule detect with the claimed power.

A *detection* is what the verdict would show of a loss: the run's recovery CI (`intervals.recovery_ci`, after
identical repeats are collapsed) ends below 100 %, i.e. `verdict.decide(low, high, 100) == "fail"`.

The truth behind the power (docs/statistics.md section 4; checked in section 8):

- the run's records, with each cluster's two arms swapped with probability 1/2: its disagreements are noise
  without a direction (the paired permutation null; a run without a flip has none);
- then FP8 loses whole clusters at random: each with probability q, every variant record of a lost cluster
  scored 0. For a given mean drop, losses that move together (a whole question, a whole NIAH cell) carry the
  most variance, so this is the worst case of how losses cluster.

The drop is q times the mean variant score before the loss (the mean of both arms' records, by the swap); the
MDE is the least drop whose detection probability reaches `power`. Binary records, one per cluster, with no
disagreement (greedy runs without a flip, the usual case): exact binomial sums over the count lost.
Otherwise: `DRAWS` draws seeded from the data (a rerun prints the same MDE; Monte Carlo error about 0.4
points of power at 80 %). Each draw orders its clusters by a uniform, so the lost set at q is a prefix of that
order, and the CI is computed for every prefix at once from running sums (`_fieller_high`, the vectorised
twin of `intervals.fieller_from_moments`' upper end).
"""

from __future__ import annotations

import functools
import hashlib
import math
from typing import Sequence

import numpy as np

from fp8eval.metrics import intervals

DRAWS = 10_000  # seeded draws behind a simulated MDE
_CHUNK = 200_000  # draws x clusters per block (memory)


def mde(pairs: Sequence[tuple[str, float, float]], level: float = 0.95, power: float = 0.8) -> float | None:
    """The MDE (score units, 0-1) of paired records `(cluster, baseline, variant)` (module docstring): exact
    for binary one-per-cluster records without a disagreement, else simulated. None when no drop, not even a
    total loss, is detected with probability `power` (too few clusters)."""
    clusters: dict[str, list[tuple[float, float]]] = {}
    for c, b, v in pairs:
        clusters.setdefault(str(c), []).append((float(b), float(v)))
    key = tuple(sorted(tuple(sorted(recs)) for recs in clusters.values()))  # canonical: names and order do not count
    return _mde(key, float(level), float(power))


@functools.lru_cache(maxsize=256)
def _mde(key: tuple, level: float, power: float) -> float | None:
    recs = [r for c in key for r in c]
    n_rec = len(recs)
    pre = sum(b + v for b, v in recs) / 2.0 / n_rec  # mean variant score before the loss
    if len(key) < 2 or pre <= 0:
        return None
    binary = all(x in (0.0, 1.0) for r in recs for x in r)
    if binary and n_rec == len(key) and all(b == v for b, v in recs):
        q = _exact_q(sum(1 for b, _ in recs if b == 1.0), n_rec - sum(1 for b, _ in recs if b == 1.0), level, power)
    else:
        q = _simulated_q(key, level, power, binary and n_rec == len(key))
    return None if q >= 1.0 else q * pre


def _exact_q(right: int, wrong: int, level: float, power: float) -> float:
    """Binary pairs, `right` right in both arms and `wrong` in neither: the least q with
    P(Binomial(right, q) >= need) >= power, `need` the least count lost whose Bonett-Price upper end (the
    verdict's CI) is below 1. 1.0 when no count is detected."""
    need = next((j for j in range(1, right + 1) if intervals.bonett_price_ratio(right - j, 0, j, level)[2] < 1.0),
                None)
    if need is None:
        return 1.0

    def detect(q: float) -> float:  # P(Binomial(right, q) >= need) = I_q(need, right - need + 1)
        return intervals.beta_inc(need, right - need + 1, q)

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if detect(mid) < power else (lo, mid)
    return hi


def _states(key: tuple, bp: bool) -> np.ndarray:
    """Additive sums of each cluster (axis 1) in each state (axis 0: as seen, swapped, lost, lost swapped).
    Bonett-Price (`bp`): counts right in both, lost, gained. Else: `_sums`."""
    out = []
    for swap, lost in ((0, 0), (1, 0), (0, 1), (1, 1)):
        rows = []
        for c in key:
            base = [v if swap else b for b, v in c]
            var = [0.0 if lost else (b if swap else v) for b, v in c]
            if bp:
                rows.append((float(base[0] == var[0] == 1.0), float(base[0] > var[0]), float(var[0] > base[0])))
                continue
            rows.append(_sums(base, var))
        out.append(rows)
    return np.asarray(out, dtype=float)


def _sums(base: Sequence[float], var: Sequence[float]) -> tuple[float, ...]:
    """One cluster's additive sums: B, B^2, D, D^2, D B, D^2 / size, Q (sum of squared record differences),
    size, size^2; B and D the cluster's baseline and difference (variant - baseline) sums."""
    big_b, big_d, size = sum(base), sum(var) - sum(base), float(len(base))
    return (big_b, big_b * big_b, big_d, big_d * big_d, big_d * big_b, big_d * big_d / size,
            sum((y - x) ** 2 for x, y in zip(base, var)), size, size * size)


def _simulated_q(key: tuple, level: float, power: float, bp: bool) -> float:
    """The least q detected in a share `power` of DRAWS seeded draws (module docstring)."""
    st = _states(key, bp)
    n = len(key)
    seed = int.from_bytes(hashlib.sha256(repr((key, level)).encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    crit = []
    step = max(1, _CHUNK // n)
    for start in range(0, DRAWS, step):
        c = min(step, DRAWS - start)
        swap = rng.random((c, n)) < 0.5
        u = rng.random((c, n))
        seen = np.where(swap[..., None], st[1][None], st[0][None])
        gone = np.where(swap[..., None], st[3][None], st[2][None])
        order = np.argsort(u, axis=1)
        delta = np.take_along_axis(gone - seen, order[..., None], axis=1)
        sums = seen.sum(axis=1)[:, None, :] + np.concatenate([np.zeros((c, 1, st.shape[2])),
                                                                np.cumsum(delta, axis=1)], axis=1)
        if bp:
            high = intervals.bonett_price_vec(sums[..., 0], sums[..., 2], sums[..., 1], level)[1]
        else:
            high = fieller(sums, n, level)[1]
        undetected = ~(high < 1.0)  # (c, n + 1): after m = 0 .. n clusters lost
        last = np.where(undetected.any(axis=1), n - np.argmax(undetected[:, ::-1], axis=1), -1)
        m_star = last + 1  # detected at every m >= m_star
        u_sorted = np.take_along_axis(u, order, axis=1)
        crit.append(np.where(m_star == 0, 0.0, np.where(m_star > n, np.inf,
                                                         u_sorted[np.arange(c), np.clip(m_star - 1, 0, n - 1)])))
    q_star = np.sort(np.concatenate(crit))  # draw i detects at q > q_star[i]
    q = float(q_star[min(len(q_star) - 1, math.ceil(power * len(q_star)) - 1)])
    return 1.0 if not math.isfinite(q) else q


def fieller(sums: np.ndarray, n: int, level: float) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of `intervals.fieller_from_moments` (ratio, 1 = no change; high inf when unbounded) from
    additive cluster sums (last axis: `_sums`' columns) of n clusters, with `intervals.together` and
    `floor_variance`: its vectorised twin, for many draws at once."""
    s_b, s_bb, s_d, s_dd, s_db, s_d2s, s_q, big_n, s_s2 = (sums[..., i] for i in range(9))
    k = big_n / n
    mb, md = s_b / (k * n), s_d / (k * n)
    sbb = (s_bb / k ** 2 - n * mb ** 2) / (n - 1)
    sdd = np.maximum((s_dd / k ** 2 - n * md ** 2) / (n - 1), 0.0)
    sdb = (s_db / k ** 2 - n * md * mb) / (n - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        k0 = (big_n - s_s2 / big_n) / (n - 1)
        msb = np.maximum(s_d2s - s_d ** 2 / big_n, 0.0) / (n - 1)
        msw = np.maximum(s_q - s_d2s, 0.0) / np.maximum(big_n - n, 1.0)
        denom = msb + (k0 - 1.0) * msw
        rho = np.where(denom <= 1e-15, 1.0, np.clip((msb - msw) / denom, 0.0, 1.0))
    together = np.where(big_n <= n, 1.0, 1.0 + (k0 - 1.0) * rho)
    floor = 2.0 * (np.minimum(together, k) / k) ** 2 / (n - 1)
    t2 = intervals.t_quantile(0.5 + level / 2.0, n - 1) ** 2 / n
    qa = mb * mb - t2 * sbb
    qb = md * mb - t2 * sdb
    qc = md * md - t2 * np.maximum(sdd, floor)
    disc = qb * qb - qa * qc
    ok = (qa > 0) & (disc >= -1e-12 * (qb * qb + np.abs(qa * qc)))  # 0 up to rounding (a total loss)
    root, qa1 = np.sqrt(np.maximum(disc, 0.0)), np.where(ok, qa, 1.0)
    return (np.where(ok, np.maximum(0.0, 1.0 + (qb - root) / qa1), 0.0),
            np.where(ok, 1.0 + (qb + root) / qa1, np.inf))


# --- what more of the same data would decide (clustered data) --------------------------------------------
MORE_DRAWS = 4000  # draws behind a clustered more_samples (Monte Carlo error about 0.6 points at 80 %)


def decide_chance(pairs: Sequence[tuple[str, float, float]], more: int, level: float, gate: float,
                  margin: float = 0.0) -> float:
    """P(the verdict's CI decides: pass or fail at `gate` % less `margin`) when `more` clusters, drawn from
    the run's own clusters (its observed rates as the truth), join the run: MORE_DRAWS draws seeded from the
    data, each judged by clustered Fieller with the one-way cap of `intervals.recovery_ci` and the gate rule
    of `verdict.decide`."""
    key, stats, shares, pos, capped = _cluster_table(tuple((str(c), float(b), float(v)) for c, b, v in pairs))
    n = len(key)
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(repr((key, level, more)).encode()).digest()[:8],
                                               "little"))
    w = 1.0 + rng.multinomial(more, np.full(n, 1.0 / n), size=MORE_DRAWS)
    low, high = fieller(w @ stats, n + more, level)
    g = (gate - margin) / 100.0
    passes = low >= g
    if capped:  # FP8 only lost: the exact one-way bound caps the lower end
        lost, n_pos = w @ shares, w @ pos
        limit = np.array([_one_way_limit(int(round(m)), g, level) for m in n_pos])
        passes &= lost <= limit
    return float(np.mean(passes | (high < gate / 100.0)))


@functools.lru_cache(maxsize=64)
def _cluster_table(pairs: tuple) -> tuple:
    """Canonical clusters of `pairs`, their `_sums`, one-way shares lost, baseline-positive flags, and whether
    the one-way cap applies (binary scores, no cluster gained)."""
    clusters: dict[str, list[tuple[float, float]]] = {}
    for c, b, v in pairs:
        clusters.setdefault(str(c), []).append((float(b), float(v)))
    key = tuple(sorted(tuple(sorted(recs)) for recs in clusters.values()))
    stats = np.array([_sums([b for b, _ in c], [v for _, v in c]) for c in key])
    big_b, big_v = stats[:, 0], stats[:, 0] + stats[:, 2]
    pos = (big_b > 0).astype(float)
    shares = np.where(big_b > 0, (big_b - big_v) / np.where(big_b > 0, big_b, 1.0), 0.0)
    binary = all(x in (0.0, 1.0) for c in key for r in c for x in r)
    return key, stats, shares, pos, binary and not bool(np.any(big_v > big_b + 1e-12))


@functools.lru_cache(maxsize=4096)
def _one_way_limit(n_pos: int, gate: float, level: float) -> float:
    """The most (fractional) losses among n_pos clusters at which `intervals.one_way_passes` still passes the
    gate (a fraction); -1 when none does. P(Binomial(n_pos, 1 - gate) <= x) rises with x."""
    if n_pos <= 0 or not intervals.one_way_passes(0.0, n_pos, gate, level):
        return -1.0
    lo, hi = 0.0, float(n_pos)
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if intervals.one_way_passes(mid, n_pos, gate, level) else (lo, mid)
    return lo


def more_clusters(pairs: Sequence[tuple[str, float, float]], level: float, gate: float, margin: float,
                  power: float, top: int) -> int | None:
    """The fewest clusters (drawn from the run's own) whose joining gives the CI a `power` chance to decide
    (`decide_chance`), by bisection to 0.5 %; None when even `top` do not."""
    if top < 1 or decide_chance(pairs, top, level, gate, margin) < power:
        return None
    lo, hi = 0, top
    while hi - lo > max(1, hi // 200):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if decide_chance(pairs, mid, level, gate, margin) < power else (lo, mid)
    return max(1, hi)
