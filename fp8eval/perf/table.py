"""The table `python -m fp8eval.perf` prints."""

from __future__ import annotations

from typing import Any

from fp8eval.metrics.latency import R2_WARN


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def format_table(result: dict[str, Any]) -> str:
    """One row per arm: ITL fit, TTFT fit, throughput, KV capacity; break-even and overhead below."""
    head = (f"{'arm':<14} {'ITL slope ms/tok':>17} {'ITL icpt ms':>11} {'R²':>6} {'TTFT(c) ms/tok²':>16} "
            f"{'tok/s @c8':>10} {'med ITL ms':>10} {'KV tokens':>11} {'gain':>6} {'break-even':>11}")
    weights = "dummy weights" if result.get("dummy_weights") else "weights"
    lines = [f"fp8eval.perf: {result['model']} ({weights}; client {result['client']})", head, "-" * len(head)]
    for name, arm in result["arms"].items():
        if "error" in arm:
            lines.append(f"{name:<14} FAILED: {arm['error'][:200]}")
            continue
        itl, ttft, tp = arm.get("itl_fit") or {}, arm.get("ttft_fit") or {}, arm.get("throughput") or {}
        lines.append(
            f"{name:<14} {_num(itl.get('slope_ms_per_token'), '17.3e')} {_num(itl.get('intercept_ms'), '11.3f')} "
            f"{_num(itl.get('r2'), '6.3f')} {_num(ttft.get('c'), '16.3e')} {_num(tp.get('output_tok_s'), '10.1f')} "
            f"{_num(tp.get('median_itl_ms'), '10.3f')} {_num(arm.get('kv_capacity_tokens'), '11,d')} "
            f"{_num(arm.get('capacity_gain'), '6.2f')} {_num(arm.get('break_even_tokens'), '11,.0f')}")
    be = result.get("break_even_tokens")
    lines.append("")
    if result["variant"] == result["baseline"] or len(result["arms"]) < 2:
        lines.append("one arm measured: no break-even")
    else:
        lines.append(f"break-even ({result['variant']} vs {result['baseline']}): "
                     + (f"{be:,.0f} tokens of context" if be is not None
                        else "none (FP8 never faster per token, or no fit)"))
    noisy = [n for n, a in result["arms"].items() if ((a.get("itl_fit") or {}).get("r2") or 1.0) < R2_WARN]
    if noisy:
        lines.append(f"warning: the ITL fit of {', '.join(noisy)} has R² < {R2_WARN}: the latencies are noisy "
                     "(a busy machine?), so slopes and break-even are rough")
    oh = result.get("client_overhead") or {}
    if oh.get("itl_ms") is not None:
        lines.append(f"client overhead (measured minus true on a fake server of known latency): ITL {oh['itl_ms']:.4f} ms, TTFT {oh['ttft_ms']:.3f} ms")
    return "\n".join(lines)
