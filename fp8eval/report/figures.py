"""The report's figures, as PNG and SVG, in the seed study's style.

- pass@1 per context bucket with a ±1 stderr band per arm (MRCR; any task with length buckets),
- overall score bars per arm with ±1 stderr error bars (the reasoning benchmarks),
- needle heatmaps, context length × depth, per arm and variant − baseline, built from each record's
  groups (`ctx=...`, `depth=...`),
- a recovery heatmap across model × variant (rows) and task (columns), marked with the verdicts.

matplotlib runs headless (Agg) and is imported here only, so `fp8eval.report` stays cheap to import.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fp8eval.metrics.groups import (
    depth_family,
    families,
    length_family,
    parse_number,
    parse_size,
    short_size,
    split_label,
)
from fp8eval.report.analysis import Pair, cell_table
from fp8eval.report.load import Arm


@dataclass
class Figure:
    name: str  # file stem
    title: str
    caption: str
    png: Path
    svg: Path


_THEMED = False


def _plt():
    global _THEMED
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    import seaborn as sns

    if not _THEMED:  # once per process: set_theme is slow and global
        sns.set_theme(style="whitegrid", context="notebook", font_scale=0.95)
        plt.rcParams.update({"svg.hashsalt": "fp8eval", "axes.titleweight": "bold", "figure.dpi": 100})
        _THEMED = True
    return plt, sns


def slug(*parts: str) -> str:
    """A file-name-safe name from the parts (runs of other characters become '-'); 'figure' when empty."""
    text = "_".join(parts)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "figure"


def _save(fig, out_dir: Path, name: str, title: str, caption: str) -> Figure:
    png, svg = out_dir / f"{name}.png", out_dir / f"{name}.svg"
    fig.savefig(png, dpi=130, bbox_inches="tight", metadata={"Software": None})
    fig.savefig(svg, bbox_inches="tight", metadata={"Date": None, "Creator": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return Figure(name, title, caption, png, svg)


def _arm_order(labels: list[str], baselines: set[str]) -> list[str]:
    """Baselines first (bf16), then variants, each alphabetical."""
    return sorted(set(labels), key=lambda a: (a not in baselines, a))


def _palette(sns, order: list[str], baselines: set[str]) -> dict[str, tuple]:
    colors = sns.color_palette("colorblind", n_colors=max(3, len(order)))
    # The baseline keeps the same dark blue in every figure; variants take the next colours.
    out, k = {}, 1
    for a in order:
        if a in baselines:
            out[a] = colors[0]
        else:
            out[a] = colors[k % len(colors)]
            k += 1
    return out


def bucket_figure(model: str, task: str, arm_stats: pd.DataFrame, baselines: set[str],
                  out_dir: Path) -> Figure | None:
    """Score per context bucket of every arm of one (model, task), with ±1 stderr bands; None without a length family of
    at least two scored buckets."""
    sub = arm_stats[(arm_stats["model"] == model) & (arm_stats["task"] == task)]
    fam = length_family([g for g in sub["group"] if g != "all"])
    if fam is None:
        return None
    plt, sns = _plt()
    # Buckets no arm could score (beyond the model's context: all skipped) are left off the axis;
    # the caption says which.
    scored = set(sub[sub["n"] > 0]["group"])
    every = families(sub["group"][sub["group"] != "all"])[fam]
    labels = [g for g in every if g in scored]
    unscored = [g for g in every if g not in scored]
    if len(labels) < 2:
        return None
    sizes = [parse_size(split_label(g)[1]) for g in labels]
    order = _arm_order(list(sub["arm"]), baselines)
    pal = _palette(sns, order, baselines)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    x = np.arange(len(labels))
    for arm in order:
        a = sub[sub["arm"] == arm].set_index("group").reindex(labels)
        y, e = a["score"].to_numpy(float), a["stderr"].fillna(0).to_numpy(float)
        ax.plot(x, y, marker="o", lw=2, color=pal[arm], label=arm)
        ax.fill_between(x, y - e, y + e, color=pal[arm], alpha=0.2, lw=0)
    ax.set_xticks(x, [short_size(s) for s in sizes])
    ax.set_xlabel("context bucket (tokens)" if fam == "bucket" else f"{fam} (tokens)")
    ax.set_ylabel("pass@1 (mean over repeats)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{model} · {task}: pass@1 per bucket")
    ax.legend(title="KV cache", frameon=True)
    cap = "Lines: mean pass@1 of each arm per bucket; bands: ±1 stderr (across repeats when repeated)."
    if unscored:
        cap += f" Not scored in any arm (all records skipped): {', '.join(unscored)}."
    return _save(fig, out_dir, slug("buckets", model, task), f"{model} · {task} per bucket", cap)


def bars_figure(model: str, arm_stats: pd.DataFrame, baselines: set[str], out_dir: Path) -> Figure | None:
    """Bars of every arm's overall score per task for one model, with ±1 stderr; None without rows."""
    sub = arm_stats[(arm_stats["model"] == model) & (arm_stats["group"] == "all")]
    if sub.empty:
        return None
    plt, sns = _plt()
    tasks = sorted(sub["task"].unique())
    order = _arm_order(list(sub["arm"]), baselines)
    pal = _palette(sns, order, baselines)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(tasks) + 2.5), 4.2))
    width = 0.8 / len(order)
    for i, arm in enumerate(order):
        a = sub[sub["arm"] == arm].set_index("task").reindex(tasks)
        xs = np.arange(len(tasks)) - 0.4 + width * (i + 0.5)
        y, e = a["score"].to_numpy(float), a["stderr"].fillna(0).to_numpy(float)
        bars = ax.bar(xs, y, width * 0.95, yerr=e, capsize=4, color=pal[arm], label=arm,
                      error_kw={"elinewidth": 1.2, "ecolor": "#333333"})
        for bar, val, err in zip(bars, y, e):
            if math.isfinite(val):
                ax.annotate(f"{val * 100:.1f}", (bar.get_x() + bar.get_width() / 2, val + err),
                            xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
    ax.set_xticks(np.arange(len(tasks)), tasks)
    ax.set_ylabel("score (pass@1)")
    ax.set_ylim(0, 1.12)
    ax.set_title(f"{model}: score per task and KV cache")
    ax.legend(title="KV cache", frameon=True, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    cap = "Bars: mean score per arm; error bars: ±1 stderr (across repeats when repeated). Labels in %."
    return _save(fig, out_dir, slug("scores", model), f"{model} · scores per task", cap)


def _needle_grid(arm: Arm, len_fam: str, depth_fam: str) -> pd.DataFrame | None:
    cells = cell_table(arm)
    if cells.empty:
        return None

    def coord(groups, fam, parse):
        for g in groups:
            f, v = split_label(g)
            if f == fam:
                return parse(v)
        return None

    cells = cells.assign(length=cells["groups"].map(lambda gs: coord(gs, len_fam, parse_size)),
                         depth=cells["groups"].map(lambda gs: coord(gs, depth_fam, parse_number)))
    cells = cells.dropna(subset=["length", "depth"])
    if cells.empty:
        return None
    return cells.pivot_table(index="depth", columns="length", values="score", aggfunc="mean").sort_index()


def needle_figure(model: str, task: str, pairs: list[Pair], out_dir: Path) -> Figure | None:
    """Heatmaps of score by context length and needle depth for each arm of one (model, task), and variant minus
    baseline; None without length and depth groups."""
    mine = [p for p in pairs if p.model == model and p.task == task]
    if not mine:
        return None
    labels = {g for p in mine for gs in p.all_keys["groups"] for g in gs}
    len_fam, depth_fam = length_family(labels), depth_family(labels)
    if len_fam is None or depth_fam is None:
        return None
    panels: list[tuple[str, pd.DataFrame, bool]] = []
    seen: set[str] = set()
    for p in mine:
        for arm in (p.baseline, p.variant):
            if arm.fingerprint not in seen:
                grid = _needle_grid(arm, len_fam, depth_fam)
                if grid is not None:
                    panels.append((arm.label, grid, False))
                    seen.add(arm.fingerprint)
    for p in mine:
        b, v = _needle_grid(p.baseline, len_fam, depth_fam), _needle_grid(p.variant, len_fam, depth_fam)
        if b is not None and v is not None:
            panels.append((f"{p.variant.label} − {p.baseline.label}", v.sub(b), True))
    if not panels:
        return None
    plt, sns = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels) + 0.6, 3.9), squeeze=False)
    for ax, (title, grid, is_diff) in zip(axes[0], panels):
        show = grid.copy()
        show.columns = [short_size(c) for c in show.columns]
        show.index = [f"{d:g}%" for d in show.index]
        if is_diff:
            sns.heatmap(show, ax=ax, cmap="RdBu", center=0, vmin=-1, vmax=1, annot=True, fmt=".2f",
                        annot_kws={"fontsize": 7}, cbar_kws={"label": "Δ score"})
        else:
            sns.heatmap(show, ax=ax, cmap="RdYlGn", vmin=0, vmax=1, annot=True, fmt=".2f",
                        annot_kws={"fontsize": 7}, cbar_kws={"label": "score"})
        ax.grid(False)
        ax.set_title(title)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("needle depth")
    fig.suptitle(f"{model} · {task}: needle retrieval by context length and depth", fontweight="bold")
    fig.tight_layout()
    cap = ("Each cell: mean score of that arm's records at that context length and depth; the last"
           " panel(s): variant minus baseline (blue: variant better, red: worse).")
    return _save(fig, out_dir, slug("needle", model, task), f"{model} · {task} needle heatmaps", cap)


def recovery_heatmap(headline: pd.DataFrame, gate: float, out_dir: Path) -> Figure | None:
    """Headline recovery % of every (model, variant vs baseline) by task, coloured around the gate and marked with the
    verdict; None when no recovery is defined."""
    if headline.empty:
        return None
    plt, sns = _plt()
    from matplotlib.colors import TwoSlopeNorm

    h = headline.assign(row=headline["model"] + " · " + headline["variant"] + " vs " + headline["baseline"],
                        col=np.where(headline["group"] == "all", headline["task"],
                                     headline["task"] + " (" + headline["group"] + ")"))
    grid = h.pivot_table(index="row", columns="col", values="recovery_pct", aggfunc="first")
    if grid.empty:  # no pair has a defined recovery (e.g. every baseline scored 0)
        return None
    marks = h.pivot_table(index="row", columns="col", values="verdict", aggfunc="first")
    symbol = {"pass": "✓", "fail": "✗", "inconclusive": "?", "n/a": ""}
    annot = grid.copy().astype(object)
    for r in grid.index:
        for c in grid.columns:
            val = grid.loc[r, c]
            annot.loc[r, c] = "" if not np.isfinite(val) else f"{val:.1f}{symbol.get(marks.loc[r, c], '')}"
    finite = grid.to_numpy(float)[np.isfinite(grid.to_numpy(float))]
    lo = min(gate - 10.0, float(finite.min()) if finite.size else gate - 10.0)
    hi = max(105.0, float(finite.max()) if finite.size else 105.0)
    norm = TwoSlopeNorm(vmin=lo, vcenter=gate, vmax=hi)
    fig, ax = plt.subplots(figsize=(max(5.5, 1.7 * grid.shape[1] + 3.5), max(2.4, 0.7 * grid.shape[0] + 1.4)))
    ax.set_facecolor("#eeeeee")  # no pair for this model/variant and task
    sns.heatmap(grid, ax=ax, cmap="RdYlGn", norm=norm, annot=annot.to_numpy(), fmt="",
                cbar_kws={"label": "recovery % (variant / baseline)"}, linewidths=1.0, linecolor="white")
    ax.grid(False)
    ax.set_xlabel("task (headline metric)")
    ax.set_ylabel("")
    ax.set_title(f"Recovery across models, tasks and KV variants (gate {gate:g}%)")
    cap = (f"Cell: headline recovery % (AUC for MRCR, overall pass@1 otherwise); ✓ pass, ✗ fail, ? inconclusive"
           f" against the {gate:g}% gate with its CI. Colour centred on the gate; grey: not run.")
    return _save(fig, out_dir, "recovery_heatmap", "Recovery heatmap", cap)


def all_figures(arm_stats: pd.DataFrame, pairs: list[Pair], headline: pd.DataFrame, gate: float,
                out_dir: Path) -> list[Figure]:
    """Every figure the report shows (heatmap, then per model its bars, bucket and needle figures), saved under
    `out_dir`; the ones that do not apply are left out."""
    out_dir.mkdir(parents=True, exist_ok=True)
    baselines = {p.baseline.label for p in pairs}
    figs: list[Figure | None] = [recovery_heatmap(headline, gate, out_dir)]
    for model in sorted(arm_stats["model"].unique()):
        figs.append(bars_figure(model, arm_stats, baselines, out_dir))
        for task in sorted(arm_stats[arm_stats["model"] == model]["task"].unique()):
            figs.append(bucket_figure(model, task, arm_stats, baselines, out_dir))
            figs.append(needle_figure(model, task, pairs, out_dir))
    return [f for f in figs if f is not None]
