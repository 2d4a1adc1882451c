"""Recovery across attention backends: one row per (model, task, variant kv), one column per backend.

The seed's story (FP8 FlashAttention-3 on H100, FlashInfer on B200, FlashMLA for Kimi) is a comparison
of the same pair under different kernels; runs record their backend in summary.json
(`arms.<kv>.attention_backend`: requested, observed, verified) and this view lines them up.
"""

from __future__ import annotations

import pandas as pd

COLUMNS = ["model", "task", "baseline", "variant", "attention_backend", "verified", "recovery_pct", "run_dir"]


def backend_of(arm_summary: dict) -> tuple[str | None, bool]:
    """(backend, verified) of one arm: what vLLM reported, else what was asked for (declared only)."""
    info = arm_summary.get("attention_backend") or {}
    return info.get("observed") or info.get("requested"), bool(info.get("verified"))


def backend_table(runs) -> pd.DataFrame:
    """Long table: each paired run whose variant arm names a backend, with the run's overall recovery."""
    rows = []
    for run in runs:
        if run.baseline is None:
            continue
        arm = (run.summary.get("arms") or {}).get(run.variant_kv) or {}
        backend, verified = backend_of(arm)
        if backend is None:
            continue
        rows.append({"model": run.model, "task": run.task, "baseline": run.baseline, "variant": run.variant_kv,
                     "attention_backend": backend, "verified": verified,
                     "recovery_pct": (run.summary.get("recovery") or {}).get("overall"),
                     "run_dir": str(run.run_dir)})
    return pd.DataFrame(rows, columns=COLUMNS)


def wide(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, task, baseline, variant), one recovery column per backend (the latest run
    wins when one backend was run twice)."""
    if table.empty:
        return table
    return (table.pivot_table(index=["model", "task", "baseline", "variant"], columns="attention_backend",
                              values="recovery_pct", aggfunc="last")
            .reset_index().rename_axis(columns=None))


def markdown(table: pd.DataFrame) -> list[str]:
    """The report section; empty when no run names a backend."""
    if table.empty:
        return []
    w = wide(table)
    backends = [c for c in w.columns if c not in ("model", "task", "baseline", "variant")]
    lines = ["## Recovery by attention backend", "",
             ("Overall recovery (runner's point estimate) of each pair per vLLM attention backend; * = declared"
              " only (an external server does not publish its backend). Long form in `backends.csv`."), "",
             "| model | task | baseline | variant | " + " | ".join(backends) + " |",
             "|---|---|---|---|" + "---:|" * len(backends)]
    unverified = {(r.model, r.task, r.variant, r.attention_backend) for r in table.itertuples() if not r.verified}
    for r in w.itertuples(index=False):
        cells = []
        for b in backends:
            v = getattr(r, b) if b.isidentifier() else r[list(w.columns).index(b)]
            star = "*" if (r.model, r.task, r.variant, b) in unverified else ""
            cells.append("–" if pd.isna(v) else f"{v:.1f}%{star}")
        lines.append(f"| {r.model} | {r.task} | {r.baseline} | {r.variant} | " + " | ".join(cells) + " |")
    return lines + [""]
