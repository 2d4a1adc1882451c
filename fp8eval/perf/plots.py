"""perf.png: ITL vs context with each arm's fit (the seed's figure), TTFT vs context, throughput bars."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_plots(result: dict[str, Any], run_dir: Path) -> dict[str, str] | dict[str, Any]:
    """Write perf.png into run_dir; returns {"png": path} or {"error": why} (matplotlib missing, ...)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return {"error": f"no plots: {exc}"}
    arms = {n: a for n, a in result["arms"].items() if "error" not in a and a.get("points")}
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.6))
    for name, arm in arms.items():
        pts = [p for p in arm["points"] if p.get("itl_ms") is not None]
        xs = [p["input_tokens"] for p in pts]
        line = ax1.plot(xs, [p["itl_ms"] for p in pts], "o", label=f"{name} measured")[0]
        fit = arm.get("itl_fit")
        if fit and xs:
            grid = [min(xs), max(xs)]
            ax1.plot(grid, [fit["intercept_ms"] + fit["slope_ms_per_token"] * x for x in grid], "-",
                     color=line.get_color(),
                     label=f"{name}: {fit['slope_ms_per_token']:.3g}·n + {fit['intercept_ms']:.3g} (R² {fit['r2']:.3f})")
        tp = [p for p in arm["points"] if p.get("ttft_ms") is not None]
        txs = [p["input_tokens"] for p in tp]
        ax2.plot(txs, [p["ttft_ms"] for p in tp], "o", color=line.get_color(), label=f"{name} measured")
        tf = arm.get("ttft_fit")
        if tf and txs:
            lo, hi = min(txs), max(txs)
            grid = [lo + (hi - lo) * i / 50 for i in range(51)]
            ax2.plot(grid, [tf["a"] + tf["b"] * x + tf["c"] * x * x for x in grid], "-", color=line.get_color(),
                     label=f"{name} quadratic fit")
        be = arm.get("break_even_tokens")
        if be is not None and xs and be <= max(xs) * 1.5:
            ax1.axvline(be, color=line.get_color(), ls=":", label=f"break-even {name}: {be:,.0f}")
    ax1.set(xlabel="context (input tokens)", ylabel="ITL (ms)", title="Inter-token latency, concurrency 1")
    ax2.set(xlabel="context (input tokens)", ylabel="TTFT (ms)", title="Time to first token")
    names = [n for n in arms if arms[n].get("throughput")]
    vals = [arms[n]["throughput"]["output_tok_s"] or 0 for n in names]
    ax3.bar(names, vals, color=[f"C{i}" for i in range(len(names))])
    for i, v in enumerate(vals):
        ax3.text(i, v, f"{v:.0f}", ha="center", va="bottom")
    if names:
        t = arms[names[0]]["throughput"]
        ax3.set_title(f"Throughput: {t['requests']} req, conc. {t['concurrency']}, ~{t['input_tokens']}/{t['output_tokens']} tok")
    ax3.set(ylabel="output tokens/s")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(f"{result['model']}{' (dummy weights)' if result.get('dummy_weights') else ''}: "
                 f"{', '.join(result['arms'])}")
    fig.tight_layout()
    path = run_dir / "perf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {"png": str(path)}
