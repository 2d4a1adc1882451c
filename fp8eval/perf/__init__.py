"""Is FP8 KV worth it? Decode/prefill latency fits, break-even context, throughput and KV capacity.

`python -m fp8eval.perf model=... kv=fp8` (docs/perf.md). The fits are public:
`fit_line(xs, ys) -> (slope, intercept, r2)` and `break_even(slope_a, intercept_a, slope_b, intercept_b)`.
"""

from fp8eval.metrics.latency import break_even, fit_line, fit_quadratic

__all__ = ["break_even", "fit_line", "fit_quadratic"]
