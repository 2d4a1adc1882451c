"""From measured batches to perf.json figures: sweep lengths, per-length points, fits, throughput."""

from __future__ import annotations

import math
import statistics
from typing import Any

from fp8eval.metrics.latency import break_even, fit_line, fit_quadratic, itl_at
from fp8eval.perf.client import Batch


def sweep_lengths(min_input: int, max_input: int, points: int) -> list[int]:
    """Log-spaced input lengths from min_input to max_input inclusive, distinct, ascending."""
    if max_input < min_input:
        raise ValueError(f"the sweep's longest input ({max_input}) is below its shortest ({min_input}): "
                         "raise max_model_len or lower perf.min_input")
    if points <= 1 or max_input == min_input:
        return [min_input]
    ratio = (max_input / min_input) ** (1.0 / (points - 1))
    return sorted({round(min_input * ratio ** i) for i in range(points)})


def throughput_shape(input_len: int, output_len: int, jitter: float, max_model_len: int) -> tuple[int, int, float]:
    """(input, output, scale): the requested shape, scaled down as a whole when its longest jittered request
    (both lengths x (1 + jitter)) would not fit max_model_len (with 64 tokens to spare)."""
    longest = (input_len + output_len) * (1.0 + jitter)
    budget = max_model_len - 64
    scale = min(1.0, budget / longest) if longest > 0 else 1.0
    return max(1, int(input_len * scale)), max(1, int(output_len * scale)), round(scale, 6)


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def point(batch: Batch) -> dict[str, Any]:
    """One sweep point. itl_ms = the median over its requests of each request's mean inter-token latency
    (vllm bench's TPOT: decode time / (tokens - 1)); a late wake-up of client or server shifts one gap by
    its delay but a request's mean only by delay / (tokens - 1). median_gap_ms = median of every gap."""
    ok = [s for s in batch.samples if s.ok]
    gaps = [g for s in ok for g in s.itl_ms]
    per_request = [sum(s.itl_ms) / len(s.itl_ms) for s in ok if s.itl_ms]
    return {
        "input_tokens": int(statistics.median([s.input_len for s in ok])) if ok else None,
        "itl_ms": _round(_median(per_request)),
        "median_gap_ms": _round(_median(gaps)),
        "ttft_ms": _round(_median([s.ttft_ms for s in ok])),
        "output_tokens": int(statistics.median([s.output_len for s in ok])) if ok else None,
        "n": len(ok),
        "n_errors": len(batch.samples) - len(ok),
        "errors": sorted({s.error for s in batch.samples if s.error})[:3],
    }


def _round(v: float | None, digits: int = 6) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, digits)


def itl_fit(points: list[dict]) -> dict[str, Any] | None:
    """Line fit of inter-token latency (ms) against input tokens over the points, or None with fewer than two distinct
    input lengths."""
    pts = [(p["input_tokens"], p["itl_ms"]) for p in points if p.get("itl_ms") is not None]
    if len({x for x, _ in pts}) < 2:
        return None
    slope, intercept, r2 = fit_line([x for x, _ in pts], [y for _, y in pts])
    return {"slope_ms_per_token": slope, "intercept_ms": intercept, "r2": r2, "n_points": len(pts)}


def ttft_fit(points: list[dict]) -> dict[str, Any] | None:
    """Quadratic fit of time to first token (ms) against input tokens over the points, or None with fewer than three
    distinct input lengths."""
    pts = [(p["input_tokens"], p["ttft_ms"]) for p in points if p.get("ttft_ms") is not None]
    if len({x for x, _ in pts}) < 3:
        return None
    a, b, c, r2 = fit_quadratic([x for x, _ in pts], [y for _, y in pts])
    return {"a": a, "b": b, "c": c, "r2": r2, "n_points": len(pts)}


def throughput(batch: Batch, input_len: int, output_len: int, jitter: float, scale: float) -> dict[str, Any]:
    """Output tokens/s over the batch's wall time and the median of every inter-token gap."""
    ok = [s for s in batch.samples if s.ok]
    gaps = [g for s in ok for g in s.itl_ms]
    out_tokens = sum(s.output_len for s in ok)
    return {
        "output_tok_s": _round(out_tokens / batch.duration_s if batch.duration_s > 0 else None, 3),
        "median_itl_ms": _round(_median(gaps)),
        "requests": len(batch.samples),
        "n_errors": len(batch.samples) - len(ok),
        "concurrency": batch.concurrency,
        "input_tokens": input_len, "output_tokens": output_len, "jitter": jitter, "scale": scale,
        "total_output_tokens": out_tokens, "duration_s": round(batch.duration_s, 3),
        "generator_summary": batch.summary or None,
    }


def break_evens(arms: dict[str, dict], baseline: str) -> dict[str, float | None]:
    """Break-even context of every other arm against the baseline (None: it never wins or no fit)."""
    base = (arms.get(baseline) or {}).get("itl_fit")
    out: dict[str, float | None] = {}
    for name, arm in arms.items():
        if name == baseline:
            continue
        fit = arm.get("itl_fit")
        out[name] = (break_even(base["slope_ms_per_token"], base["intercept_ms"], fit["slope_ms_per_token"],
                                fit["intercept_ms"]) if base and fit else None)
    return out


__all__ = ["break_evens", "itl_at", "itl_fit", "point", "sweep_lengths", "throughput", "throughput_shape", "ttft_fit"]
