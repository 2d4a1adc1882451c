"""The report's noise floor: each flip's anatomy joined to flips.csv, and per run with a control arm the
variant's flips next to the control's with the excess flip rate and its paired CI (fp8eval.metrics.noise,
the function summary.json uses, over the arms' records as the report reads them)."""

from __future__ import annotations

import math

import pandas as pd

from fp8eval.metrics.noise import control_comparison
from fp8eval.records.anatomy import load, row_key, store_path

# flips.csv's anatomy columns (fp8eval.engines.forcing): where the two completions part, the baseline's and the
# other arm's token there, and the other arm's log-probability and rank of the baseline's token (teacher forced), the
# kernel path they were read on (decode: where the arm answered) and the prefill path's log-prob beside a decode one.
ANATOMY_COLUMNS = {"part_position": "part_position", "forced_token": "baseline_token",
                   "other_token": "variant_token", "logprob": "variant_logprob_of_baseline_token",
                   "rank": "variant_rank_of_baseline_token", "top1_token": "variant_top1_token",
                   "path": "anatomy_path", "logprob_prefill": "variant_logprob_prefill_view"}
NOISE_COLUMNS = ["model", "task", "baseline", "variant", "control", "setting", "inert", "n_pairs", "variant_lost",
                 "variant_gained", "control_lost", "control_gained", "excess_flip_rate", "ci_low", "ci_high"]


def attach_anatomy(flips: pd.DataFrame, pairs) -> pd.DataFrame:
    """flips.csv with the anatomy columns (empty where a flip was not dissected: anatomy=false, an engine
    without teacher forcing, or a report over records from elsewhere)."""
    flips = flips.copy()
    for col in ANATOMY_COLUMNS.values():
        flips[col] = None
    if flips.empty:
        return flips
    for pair in pairs:
        mask = ((flips["model"] == pair.model) & (flips["task"] == pair.task)
                & (flips["baseline"] == pair.baseline.label) & (flips["variant"] == pair.variant.label))
        if not mask.any():
            continue
        rows = load(store_path(pair.variant.records_path.parents[1], pair.task, pair.variant.fingerprint))
        if not rows:
            continue
        b_text = {(str(r.data["sample_id"]), int(r.data["repeat"])): r.data.get("completion") for r in pair.baseline.records}
        v_text = {(str(r.data["sample_id"]), int(r.data["repeat"])): r.data.get("completion") for r in pair.variant.records}
        for i in flips.index[mask]:
            key = (str(flips.at[i, "sample_id"]), int(flips.at[i, "repeat"]))
            got = rows.get(row_key(key[0], key[1], b_text.get(key), v_text.get(key)))
            if got:
                for src, col in ANATOMY_COLUMNS.items():
                    flips.at[i, col] = got.get(src)
    return flips


def noise_table(runs, right_at: float, level: float) -> pd.DataFrame:
    """One row per run with a control arm: both arms' flips against the baseline and the excess with its CI."""
    out = []
    for run in runs:
        c = run.summary.get("control") or {}
        if not c or run.baseline is None or c.get("arm") not in run.arms or run.variant_kv not in run.arms:
            continue
        b, v, k = run.arms[run.baseline], run.arms[run.variant_kv], run.arms[c["arm"]]
        cmp = control_comparison([r.data for r in b.records], [r.data for r in v.records],
                                 [r.data for r in k.records], right_at, level)
        ci = cmp["ci"] or [math.nan, math.nan]
        out.append({"model": run.model, "task": run.task, "baseline": b.label, "variant": v.label, "control": k.label,
                    "setting": c.get("description") or c.get("name"), "inert": bool(c.get("inert")),
                    "n_pairs": cmp["n_pairs"], "variant_lost": cmp["variant"]["lost"],
                    "variant_gained": cmp["variant"]["gained"], "control_lost": cmp["control"]["lost"],
                    "control_gained": cmp["control"]["gained"],
                    "excess_flip_rate": math.nan if cmp["excess_flip_rate"] is None else cmp["excess_flip_rate"],
                    "ci_low": ci[0], "ci_high": ci[1]})
    df = pd.DataFrame(out, columns=NOISE_COLUMNS)
    return df.drop_duplicates(subset=["model", "task", "baseline", "variant", "control"]).reset_index(drop=True)


def control_labels(runs) -> set[str]:
    """Labels of the arms that are some run's control arm (not variants to decide on)."""
    return {run.arms[n].label for run in runs for n, a in (run.summary.get("arms") or {}).items()
            if isinstance(a, dict) and a.get("role") == "control" and n in run.arms}


def anatomy_text(flip: dict) -> str:
    """One flip's anatomy in words ("" when it was not dissected)."""
    pos = flip.get("part_position")
    if pos is None or (isinstance(pos, float) and math.isnan(pos)):
        return ""
    text = (f"; parts at completion token {int(pos)}: baseline {flip.get('baseline_token')!r}, this arm"
            f" {flip.get('variant_token')!r}")
    lp, rank = flip.get("variant_logprob_of_baseline_token"), flip.get("variant_rank_of_baseline_token")
    if lp is not None and not (isinstance(lp, float) and math.isnan(lp)):
        text += f"; teacher-forced, this arm gives the baseline's token log-prob {float(lp):.3f}"
        text += f" (rank {int(rank)})" if rank is not None and not (isinstance(rank, float) and math.isnan(rank)) else ""
    return text


def _pts(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:+.1f}"


def markdown(noise: pd.DataFrame, level: float) -> list[str]:
    """The report.md section: the variant's flips next to the control's, and the excess."""
    if noise is None or noise.empty:
        return []
    lines = ["", "## Noise floor (control arms)", "",
             "A control arm runs the baseline's kv option again with something that should not change accuracy."
             f" Excess = the variant's flip rate minus the control's on the same (sample, repeat) pairs, in points,"
             f" with a {level * 100:.0f}% paired interval (Newcombe's score interval, clustered by sample when a"
             " sample has several repeats); an excess whose interval covers 0 is"
             " within the noise floor. Per-flip anatomy (where the completions part, the arm's log-prob and rank"
             " of the baseline's token) is in the Flips table and `flips.csv`.", "",
             "| model | task | variant | control | setting | pairs | variant lost/gained | control lost/gained |"
             " excess (pts) | CI |", "|---|---|---|---|---|---:|---:|---:|---:|---|"]
    for r in noise.itertuples():
        lines.append(f"| {r.model} | {r.task} | {r.variant} | {r.control}{' (inert)' if r.inert else ''} | {r.setting}"
                     f" | {r.n_pairs} | {r.variant_lost}/{r.variant_gained} | {r.control_lost}/{r.control_gained}"
                     f" | {_pts(r.excess_flip_rate)} | [{_pts(r.ci_low)}, {_pts(r.ci_high)}] |")
    return lines
