"""The dashboard's first figure: recovery with its CI per task and group against the gate, a verdict per point.

A forest plot: one panel per (model, variant vs baseline), one row per task and group (the task's headline
first, then its context lengths, depths or buckets), the point the recovery %, the bar the verdict's CI (the
one summary.json and recovery.csv carry, from `fp8eval.metrics.verdict`; nothing is recomputed here), a
dashed line at the gate. The verdict is written at the end of each row and shown by the marker: shape and
fill differ, and the colours are Okabe-Ito's blue and vermillion (colour-blind safe, no red-green).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from fp8eval.metrics.groups import label_sort_key

# verdict -> (marker, face colour, edge colour, legend text). Okabe & Ito (2008): blue #0072B2, vermillion
# #D55E00, grey for the undecided; an inconclusive point is hollow, so it never reads as a fail or a pass.
VERDICT_STYLE = {
    "pass": ("o", "#0072B2", "#0072B2", "pass: CI above the gate"),
    "fail": ("X", "#D55E00", "#D55E00", "fail: CI below the gate"),
    "inconclusive": ("D", "white", "#555555", "inconclusive: CI straddles the gate"),
    "n/a": ("s", "#bbbbbb", "#bbbbbb", "n/a: no recovery"),
}
# Heatmap cells (fp8eval.report.figures.recovery_heatmap): light tints of the same colours; inconclusive hatched.
VERDICT_FILL = {"pass": "#a6cde8", "fail": "#f2b48f", "inconclusive": "#e4e4e4", "n/a": "#ffffff"}


def verdict_ci(row) -> tuple[float, float, float, str]:
    """(recovery %, CI low, CI high, verdict) of one recovery-table row: the only place the dashboard reads the
    verdict's fields, so a rename in fp8eval.metrics is a one-line change here."""
    return (float(row["recovery_pct"]), float(row["ci_low"]), float(row["ci_high"]), str(row["verdict"]))


def verdict_diff(row) -> tuple[float, float]:
    """The verdict's CI of variant − baseline in points of score (low, high), likewise read in one place."""
    return float(row["diff_low_pts"]), float(row["diff_high_pts"])


def _rows(table: pd.DataFrame) -> list[tuple[tuple[str, str, str], pd.DataFrame]]:
    """Per (model, variant, baseline) its rows in plot order: per task the headline (AUC, else all), then the
    overall pass@1, then every other row in label order. Groups with no pair (every record skipped) are left
    out: they have nothing to show."""
    out = []
    table = table[table["n"] > 0]
    for key, g in table.groupby(["model", "variant", "baseline"], sort=True):
        parts = []
        for _, t in g.groupby("task", sort=True):
            head = "auc" if (t["group"] == "auc").any() else "all"
            rank = t["group"].map(lambda x: (0, ()) if x == head else (1, ()) if x == "all" else (2, label_sort_key(x)))
            parts.append(t.assign(_rank=rank).sort_values("_rank", kind="stable").drop(columns="_rank"))
        out.append((key, pd.concat(parts)))
    return out


def _limits(values: list[tuple[float, float, float, str]], gate: float) -> tuple[float, float]:
    finite = [x for r, lo, hi, _ in values for x in (r, lo, hi) if math.isfinite(x)]
    lo = min([gate - 10.0, *finite]) if finite else gate - 10.0
    hi = max([105.0, *finite]) if finite else 105.0
    return max(0.0, math.floor(lo / 10) * 10), min(max(gate + 20.0, math.ceil(hi / 10) * 10), 250.0)


def recovery_ci_figure(table: pd.DataFrame, gate: float, level: float, out_dir: Path, plt, save):
    """The forest plot of every recovery row with its CI against `gate`; None when no row has a recovery. `plt` is
    the themed pyplot and `save` figures._save (the file pair and the Figure record)."""
    if table.empty or not np.isfinite(table["recovery_pct"].to_numpy(float)).any():
        return None
    panels = _rows(table)
    heights = [max(1.2, 0.32 * len(rows) + 0.7) for _, rows in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9.0, sum(heights) + 0.9), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    every = [verdict_ci(r) for _, rows in panels for _, r in rows.iterrows()]
    x_lo, x_hi = _limits(every, gate)
    lv = f"{level * 100:.0f}%"
    for ax, ((model, variant, baseline), rows) in zip(axes[:, 0], panels):
        labels = []
        for i, (_, r) in enumerate(rows.iterrows()):
            rec, lo, hi, verdict = verdict_ci(r)
            first = i == 0 or rows.iloc[i - 1]["task"] != r["task"]  # the task's headline
            label = r["task"] if first and r["group"] == "all" else \
                f"{r['task']} · {'pass@1' if r['group'] == 'all' else r['group']}"
            labels.append(label)
            marker, face, edge, _ = VERDICT_STYLE.get(verdict, VERDICT_STYLE["n/a"])
            if math.isfinite(lo):
                ends = (max(lo, x_lo), min(hi, x_hi) if math.isfinite(hi) else x_hi)
                ax.plot(ends, (i, i), color=edge, lw=2.2, solid_capstyle="butt", zorder=2)
                if not math.isfinite(hi) or hi > x_hi:  # the CI runs past the axis (or is unbounded)
                    ax.plot(x_hi, i, marker=">", color=edge, ms=7, zorder=3, clip_on=False)
                if lo < x_lo:
                    ax.plot(x_lo, i, marker="<", color=edge, ms=7, zorder=3, clip_on=False)
            if math.isfinite(rec):
                ax.plot(min(max(rec, x_lo), x_hi), i, marker=marker, ms=8, mfc=face, mec=edge, mew=1.8,
                        ls="none", zorder=4)
            ci = f"{lo:.0f}–{hi:.0f}%" if math.isfinite(lo) and math.isfinite(hi) else \
                (f"{lo:.0f}%–∞" if math.isfinite(lo) else "no CI")
            text = f"{rec:.1f}% [{ci}]  {verdict}" if math.isfinite(rec) else verdict
            ax.annotate(text, (1.01, i), xycoords=("axes fraction", "data"), va="center", fontsize=8.5,
                        color=edge if verdict != "inconclusive" else "#333333", annotation_clip=False)
        ax.axvline(gate, color="#222222", ls="--", lw=1.2, zorder=1)
        ax.axvline(100.0, color="#999999", ls=":", lw=1.0, zorder=1)
        ax.set_yticks(range(len(labels)), labels, fontsize=9)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.set_xlim(x_lo, x_hi)
        ax.set_title(f"{model} · {variant} vs {baseline}", loc="left", fontsize=10.5)
        ax.grid(axis="y", visible=False)
    axes[-1, 0].set_xlabel(f"recovery % (variant / baseline × 100) with its {lv} CI; dashed: the {gate:g}% gate")
    handles = [plt.Line2D([], [], marker=m, mfc=f, mec=e, mew=1.8, ls="none", ms=8, label=t)
               for m, f, e, t in VERDICT_STYLE.values()]
    height = sum(heights) + 0.9
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / height))  # room at the top for the title and the legend
    fig.suptitle(f"Recovery with its {lv} CI against the {gate:g}% gate", fontweight="bold", y=1 - 0.1 / height)
    fig.legend(handles=handles, loc="upper center", ncol=4, fontsize=8.5, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.38 / height))
    cap = (f"Each row: a task (its headline: AUC for MRCR, else overall pass@1) or one of its groups. Point:"
           f" recovery %; bar: the verdict's {lv} CI (recovery.csv's ci_low–ci_high; an arrow: it runs past the"
           f" axis or is unbounded); dashed line: the {gate:g}% gate, dotted: 100%. Pass when the whole bar is"
           " right of the gate, fail when it is left of it, inconclusive (hollow grey diamond) when it straddles"
           " it. Colours: Okabe-Ito blue and vermillion (colour-blind safe).")
    return save(fig, out_dir, "recovery_ci", f"Recovery with its {lv} CI against the gate", cap)
