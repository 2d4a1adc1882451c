"""The report's figures, as PNG and SVG, in the seed study's style.

- first, recovery with the verdict's CI per task and group against the gate (`fp8eval.report.forest`),
- a recovery heatmap across model × variant (rows) and task (columns), coloured by the verdicts,
- pass@1 per context bucket per arm, each variant with the verdict's CI of its difference from the baseline
  (MRCR; any task with length buckets),
- overall score bars per arm, each variant with that same interval (the reasoning benchmarks),
- needle heatmaps, context length × depth, per arm and variant − baseline, built from each record's
  groups (`ctx=...`, `depth=...`).

Colours are colour-blind safe (seaborn's "colorblind" palette, Okabe-Ito for verdicts, cividis and a
blue-red diverging map for heatmaps): nothing depends on telling red from green.

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
from fp8eval.report.forest import VERDICT_FILL, recovery_ci_figure, verdict_ci, verdict_diff
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


def _verdict_band(table: pd.DataFrame, model: str, task: str, arm: str, groups: list[str]) -> np.ndarray | None:
    """Per group, the score interval (low, high) of a variant arm from the verdict's CI of its difference from
    its baseline (baseline score + diff CI): the same interval the verdict judges, on the score scale. None for
    a baseline (or an arm with no recovery row)."""
    rows = table[(table["model"] == model) & (table["task"] == task) & (table["variant"] == arm)]
    if rows.empty:
        return None
    rows = rows.drop_duplicates("group").set_index("group")
    out = np.full((len(groups), 2), np.nan)
    for i, g in enumerate(groups):
        if g in rows.index:
            lo, hi = verdict_diff(rows.loc[g])
            out[i] = [rows.loc[g, "baseline_score"] + lo / 100.0, rows.loc[g, "baseline_score"] + hi / 100.0]
    return out


def bucket_figure(model: str, task: str, arm_stats: pd.DataFrame, baselines: set[str], table: pd.DataFrame,
                  level: float, out_dir: Path) -> Figure | None:
    """Score per context bucket of every arm of one (model, task), each variant with the verdict's CI band; None
    without a length family of at least two scored buckets."""
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
        y = a["score"].to_numpy(float)
        ax.plot(x, y, marker="o", lw=2, color=pal[arm], label=arm)
        band = None if arm in baselines else _verdict_band(table, model, task, arm, labels)
        if band is not None:
            ax.fill_between(x, band[:, 0], band[:, 1], color=pal[arm], alpha=0.2, lw=0)
    ax.set_xticks(x, [short_size(s) for s in sizes])
    ax.set_xlabel("context bucket (tokens)" if fam == "bucket" else f"{fam} (tokens)")
    ax.set_ylabel("pass@1 (mean over repeats)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{model} · {task}: pass@1 per bucket")
    ax.legend(title="KV cache", frameon=True)
    cap = (f"Lines: mean pass@1 of each arm per bucket (over the arm's scored records); band around each variant:"
           f" the baseline's score plus the verdict's {level * 100:.0f}% CI of variant − baseline on the paired"
           " records (the interval the verdict judges, recovery.csv's diff_low_pts–diff_high_pts).")
    if unscored:
        cap += f" Not scored in any arm (all records skipped): {', '.join(unscored)}."
    return _save(fig, out_dir, slug("buckets", model, task), f"{model} · {task} per bucket", cap)


def bars_figure(model: str, arm_stats: pd.DataFrame, baselines: set[str], table: pd.DataFrame, level: float,
                out_dir: Path) -> Figure | None:
    """Bars of every arm's overall score per task for one model, each variant with the verdict's CI of its
    difference from the baseline; None without rows."""
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
        y = a["score"].to_numpy(float)
        band = None
        if arm not in baselines:
            parts = [_verdict_band(table, model, t, arm, ["all"]) for t in tasks]
            band = np.array([p[0] if p is not None else (np.nan, np.nan) for p in parts])
        err = None if band is None else np.nan_to_num(np.abs(band.T - y), nan=0.0)
        bars = ax.bar(xs, y, width * 0.95, yerr=err, capsize=4, color=pal[arm], label=arm,
                      error_kw={"elinewidth": 1.2, "ecolor": "#333333"})
        tops = y if err is None else y + err[1]
        for bar, val, top in zip(bars, y, tops):
            if math.isfinite(val):
                ax.annotate(f"{val * 100:.1f}", (bar.get_x() + bar.get_width() / 2, top),
                            xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
    ax.set_xticks(np.arange(len(tasks)), tasks)
    ax.set_ylabel("score (pass@1)")
    ax.set_ylim(0, 1.18)
    ax.set_title(f"{model}: score per task and KV cache")
    ax.legend(title="KV cache", frameon=True, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    cap = (f"Bars: mean score per arm (labels in %); error bar on each variant: the baseline's score plus the"
           f" verdict's {level * 100:.0f}% CI of variant − baseline on the paired records (what the verdict judges).")
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
            sns.heatmap(show, ax=ax, cmap="cividis", vmin=0, vmax=1, annot=True, fmt=".2f",
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
    """Headline recovery % of every (model, variant vs baseline) by task, each cell coloured by its verdict (an
    inconclusive one grey and hatched, never painted like a fail) and labelled with the recovery, its CI and the
    verdict; None when no recovery is defined."""
    if headline.empty:
        return None
    plt, _ = _plt()
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch, Rectangle

    h = headline.assign(row=headline["model"] + " · " + headline["variant"] + " vs " + headline["baseline"],
                        col=np.where(headline["group"] == "all", headline["task"],
                                     headline["task"] + " (" + headline["group"] + ")"))
    if not np.isfinite(h["recovery_pct"].to_numpy(float)).any():  # e.g. every baseline scored 0
        return None
    rows, cols = sorted(h["row"].unique()), sorted(h["col"].unique())
    order = list(VERDICT_FILL)
    codes = np.full((len(rows), len(cols)), np.nan)
    fig, ax = plt.subplots(figsize=(max(5.5, 1.9 * len(cols) + 3.5), max(2.4, 0.8 * len(rows) + 1.6)))
    for _, r in h.iterrows():
        i, j = rows.index(r["row"]), cols.index(r["col"])
        rec, lo, hi, verdict = verdict_ci(r)
        codes[i, j] = order.index(verdict) if verdict in order else order.index("n/a")
        ci = f"[{lo:.0f}–{hi:.0f}]" if math.isfinite(lo) and math.isfinite(hi) else \
            (f"[{lo:.0f}–∞]" if math.isfinite(lo) else "")
        text = f"{rec:.1f}%\n{ci}\n{verdict}" if math.isfinite(rec) else verdict
        ax.text(j, i, text, ha="center", va="center", fontsize=8, color="#1d2330")
        if verdict == "inconclusive":
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="#9a9a9a", lw=0))
    ax.set_facecolor("#f4f4f4")  # no pair for this model/variant and task
    ax.imshow(np.ma.masked_invalid(codes), cmap=ListedColormap([VERDICT_FILL[v] for v in order]), vmin=-0.5,
              vmax=len(order) - 0.5, aspect="auto")
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xticks(np.arange(-0.5, len(cols)), minor=True)
    ax.set_yticks(np.arange(-0.5, len(rows)), minor=True)
    ax.grid(False)
    ax.grid(which="minor", color="white", lw=2)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("task (headline metric)")
    ax.set_title(f"Recovery across models, tasks and KV variants (gate {gate:g}%)")
    ax.legend(handles=[Patch(facecolor=VERDICT_FILL[v], edgecolor="#9a9a9a", hatch="///" if v == "inconclusive"
                             else None, label=v) for v in order], loc="upper left", bbox_to_anchor=(1.01, 1.0),
              frameon=False, title="verdict")
    cap = (f"Cell: headline recovery % (AUC for MRCR, overall pass@1 otherwise), its CI and its verdict against the"
           f" {gate:g}% gate; colour by verdict: blue pass, orange fail, grey hatched inconclusive (colour-blind"
           " safe); light grey: not run.")
    return _save(fig, out_dir, "recovery_heatmap", "Recovery heatmap", cap)


def all_figures(arm_stats: pd.DataFrame, pairs: list[Pair], table: pd.DataFrame, headline: pd.DataFrame,
                gate: float, level: float, out_dir: Path) -> list[Figure]:
    """Every figure the report shows (recovery with its CI against the gate, the heatmap, then per model its bars,
    bucket and needle figures), saved under `out_dir`; the ones that do not apply are left out."""
    out_dir.mkdir(parents=True, exist_ok=True)
    baselines = {p.baseline.label for p in pairs}
    figs: list[Figure | None] = [recovery_ci_figure(table, gate, level, out_dir, _plt()[0], _save),
                                 recovery_heatmap(headline, gate, out_dir)]
    for model in sorted(arm_stats["model"].unique()):
        figs.append(bars_figure(model, arm_stats, baselines, table, level, out_dir))
        for task in sorted(arm_stats[arm_stats["model"] == model]["task"].unique()):
            figs.append(bucket_figure(model, task, arm_stats, baselines, table, level, out_dir))
            figs.append(needle_figure(model, task, pairs, out_dir))
    return [f for f in figs if f is not None]
