"""Latency fits behind "is FP8 KV worth it?" (fp8eval.perf and the report): ITL linear in context, TTFT
quadratic, the break-even context.

Plain least squares on the measured points (no weighting): the seed study's method, so its figures and
ours compare directly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

R2_WARN = 0.9  # below this an ITL line explains too little of its points to place a break-even


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares line y = slope * x + intercept; returns (slope, intercept, r2).

    r2 is 1 - SS_res / SS_tot (1.0 when every y is equal and the line hits them all). Needs at least two
    distinct x values.
    """
    n = len(xs)
    if n != len(ys) or n < 2:
        raise ValueError(f"fit_line needs two or more (x, y) pairs of equal length, got {len(xs)} and {len(ys)}")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("fit_line needs at least two distinct x values")
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    intercept = my - slope * mx
    return slope, intercept, _r2(ys, [slope * x + intercept for x in xs])


def fit_quadratic(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float, float]:
    """Least-squares y = a + b x + c x^2; returns (a, b, c, r2). Needs three or more distinct x values.

    x is rescaled to [0, 1] before solving so the normal equations stay well conditioned at 100k tokens.
    """
    import numpy as np

    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    if len(x) != len(y) or len(set(x.tolist())) < 3:
        raise ValueError("fit_quadratic needs three or more distinct x values")
    scale = float(np.max(np.abs(x))) or 1.0
    u = x / scale
    design = np.stack([np.ones_like(u), u, u * u], axis=1)
    (a, bu, cu), *_ = np.linalg.lstsq(design, y, rcond=None)
    b, c = bu / scale, cu / scale ** 2
    return float(a), float(b), float(c), float(_r2(ys, [a + b * v + c * v * v for v in xs]))


def _r2(ys: Sequence[float], pred: Sequence[float]) -> float:
    my = sum(ys) / len(ys)
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - p) ** 2 for y, p in zip(ys, pred))
    if ss_tot == 0:
        return 1.0 if ss_res == 0 else 0.0
    return 1.0 - ss_res / ss_tot


def break_even(slope_a: float, intercept_a: float, slope_b: float, intercept_b: float) -> float | None:
    """Context length above which line b (FP8) is faster than line a (BF16), or None if it never is.

    Lines cross at (intercept_b - intercept_a) / (slope_a - slope_b). b wins above that point only when
    its slope is lower. When b is already at least as fast at context 0 (intercept_b <= intercept_a) and
    grows more slowly, it wins everywhere: 0.0.
    """
    if not all(math.isfinite(v) for v in (slope_a, intercept_a, slope_b, intercept_b)):
        return None
    if slope_b >= slope_a:
        return None
    return max(0.0, (intercept_b - intercept_a) / (slope_a - slope_b))


def itl_at(fit: dict | None, context: float) -> float | None:
    """The fitted ITL (ms) at a context length, from a perf.json `itl_fit`."""
    if not fit:
        return None
    return fit["intercept_ms"] + fit["slope_ms_per_token"] * context
