"""Assembling the report: load, pair, compute, judge, draw, write."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd

import fp8eval.report.analysis as analysis
import fp8eval.report.backends as backends
import fp8eval.report.figures as figures
import fp8eval.report.noise as noise
import fp8eval.report.render as render
import fp8eval.report.verdicts as verdicts
import fp8eval.report.worth as worth
from fp8eval.core.csvio import write_csv
from fp8eval.core.progress import stage
from fp8eval.report.load import load_runs


def _clean(obj):
    """JSON without NaN (not valid JSON): NaN becomes null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def build_report(paths: list[Path], out: Path, *, n_boot: int, level: float, seed: int, strict: bool,
                 **thresholds) -> Path:
    """Load the runs, pair their arms and write recovery.csv, flips.csv, arms.csv, figures, report.md, index.html and
    verdicts.json into `out`; returns `out` resolved."""
    th = verdicts.Thresholds.from_kwargs(**thresholds)
    settings = analysis.Settings(n_boot=n_boot, level=level, seed=seed, gate=th.gate, right_at=th.right_at,
                                 margin=th.unsure_margin)
    with stage("report: reading the runs' records"):
        runs, arms = load_runs(paths)
    with stage(f"report: pairing {len(arms)} arm(s) of {len(runs)} run(s), recovery with CIs ({n_boot} bootstrap draws)"):
        pairs, refused = analysis.build_pairs(runs, strict=strict)
        table, notes = analysis.recovery_table(pairs, settings)
    notes = _store_wider_than_run(runs) + notes
    table = verdicts.apply_run_decisions(verdicts.add_verdicts(table, th, level), runs)  # one decision per run
    headline = verdicts.headline_rows(table)
    sign_tests = [s for s in (verdicts.bucket_sign_test(p, th) for p in
                              sorted(pairs, key=lambda p: (p.model, p.task, p.variant.label))) if s]
    sign_tests += verdicts.task_sign_tests(headline, th)
    flip_frames = [verdicts.flips(p, th) for p in pairs]
    flips = (pd.concat([f for f in flip_frames if len(f)], ignore_index=True)
             if any(len(f) for f in flip_frames) else pd.DataFrame(columns=verdicts.FLIP_COLUMNS))
    flips = flips.sort_values(["model", "task", "variant", "direction", "sample_id", "repeat"],
                              kind="stable").reset_index(drop=True)
    flips = noise.attach_anatomy(flips, pairs)  # where each flip's completions part (fp8eval.anatomy)
    flips = analysis.attach_completions(flips)
    noise_floor = noise.noise_table(runs, th.right_at, level)
    controls = noise.control_labels(runs)  # a control arm is a noise floor, not a variant to decide on
    decisions = verdicts.decisions(headline[~headline["variant"].isin(controls)], sign_tests, th.shift_margin)
    arm_stats = analysis.arm_table(arms)

    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    # Paths relative to the report, so a copied or moved report (with its runs) points at nothing of this machine.
    arm_stats["records"] = arm_stats["records"].map(lambda p: relative(p, out)) if len(arm_stats) else []
    for col in ("baseline_record", "variant_record"):
        flips[col] = flips[col].map(lambda ref: _relative_ref(ref, out))
    with stage("report: drawing the figures"):
        figs = figures.all_figures(arm_stats, pairs, table, headline, th.gate, level, out / "figures")
    write_csv(table.drop(columns=["why"]).round(6), out / "recovery.csv")  # text cells never run as formulas
    write_csv(flips.round(6), out / "flips.csv")
    if len(noise_floor):
        write_csv(noise_floor.round(6), out / "noise_floor.csv")
    write_csv(arm_stats.round(6), out / "arms.csv")
    by_backend = backends.backend_table(runs)
    if len(by_backend):
        by_backend["run_dir"] = by_backend["run_dir"].map(lambda p: relative(p, out))
        write_csv(by_backend.round(6), out / "backends.csv")
    inputs = [Path(relative(r.run_dir, out)) for r in runs]
    data = render.ReportData(table, headline, arm_stats, sign_tests, flips, decisions, figs, th, level,
                             n_boot, inputs, notes, refused, by_backend, noise_floor)
    worth_entries = worth.write(paths, table, th.gate, out)  # perf.json beside recovery, when present
    (out / "report.md").write_text(render.render_markdown(data, out) + worth.markdown(worth_entries),
                                   encoding="utf-8")
    page = render.render_html(data)
    (out / "index.html").write_text(page.replace("</main>", worth.html_section(worth_entries) + "</main>", 1),
                                    encoding="utf-8")
    (out / "verdicts.json").write_text(json.dumps(_clean({
        "thresholds": th.__dict__, "level": level, "n_boot": n_boot, "decisions": decisions,
        "headline": headline.drop(columns=["why"]).to_dict(orient="records"),
        "sign_tests": [{**{k: v for k, v in s.__dict__.items() if k != "units"}, "shift": s.shift,
                        "explanation": s.explain(), "units": s.units} for s in sign_tests],
        "refused": refused, "notes": notes,
    }), indent=2, default=str) + "\n", encoding="utf-8")
    return out


def relative(path, out: Path) -> str:
    """`path` relative to the report directory `out`, with forward slashes (what report.md, index.html and the
    CSVs show)."""
    return Path(os.path.relpath(Path(path).resolve(), out)).as_posix()


def _relative_ref(ref, out: Path):
    """A `file:line` record reference with its file relative to `out`."""
    if not isinstance(ref, str) or ":" not in ref:
        return ref
    path, _, line = ref.rpartition(":")
    return f"{relative(path, out)}:{line}"


def _store_wider_than_run(runs) -> list[str]:
    """The report reads every record of an arm's store; a run's summary.json counts only its own plan's
    (sample, repeat) keys. Where a store holds more (a larger grid or more repeats run into the same records
    dir), say so: the two then describe different sets of samples, never silently."""
    notes = []
    for run in runs:
        for kv, arm in run.arms.items():
            counted = (run.summary.get("arms") or {}).get(kv, {}).get("n_records")
            if isinstance(counted, int) and counted != len(arm.records):
                notes.append(f"{run.run_dir.name}: arm {kv} holds {len(arm.records)} records in its store but this"
                             f" run's summary.json counts {counted} (its own grid and repeats); the report's"
                             f" numbers for this arm use all {len(arm.records)}.")
    return notes

