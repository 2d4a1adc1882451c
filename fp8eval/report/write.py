"""`write_report`: build the report, or copy it when its inputs are unchanged."""


from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import fp8eval.report.cache as report_cache
from fp8eval.report.load import find_run_dirs
from fp8eval.report.worth import perf_key


def write_report(paths: Iterable[Path], out: Path | None = None, *, n_boot: int = 2000,
                 level: float = 0.95, seed: int = 0, strict: bool = True, cache: bool = True,
                 **thresholds) -> Path:
    """Write the report for the run directories / output roots in `paths` into `out` and return it.

    `out` defaults to `<first path>/report`. `thresholds` are the fields of
    `fp8eval.report.verdicts.Thresholds` (gate, unsure_margin, sign_alpha, right_at, z); an unknown
    name raises TypeError with the valid ones. With strict=True a pair of arms whose prompt hashes or
    task versions differ raises `PairingError`; with strict=False it is left out and listed.
    With cache=True a report whose inputs are unchanged since it was last written is copied
    (`fp8eval.report.cache`), not rebuilt.
    """

    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("write_report needs at least one run directory or output root")
    out = (Path(out) if out is not None else paths[0] / "report").resolve()
    key = None
    if cache:
        settings = {"n_boot": n_boot, "level": level, "seed": seed, "strict": strict,
                    "thresholds": dict(sorted(thresholds.items()))}
        settings["perf"] = perf_key(paths)  # a new or changed perf.json rebuilds the "worth it?" view
        run_dirs = find_run_dirs(paths)
        # The report shows its inputs relative to itself: a cached copy fits only the same layout.
        settings["layout"] = [os.path.relpath(Path(d).resolve(), out) for d in run_dirs]
        key = report_cache.report_key(run_dirs, settings)
        if key and report_cache.restore(key, run_dirs, out):
            return out

    # pandas, numpy and matplotlib load here, not at import: a cached report (a zero-work rerun) is
    # copied without them (importing fp8eval.report.build takes 0.46-0.85 s on our 2-core CI box, the
    # cached path 0.10 s: `python -c "import fp8eval.report.build"`).
    from fp8eval.report.build import build_report  # noqa: PLC0415

    result = build_report(paths, out, n_boot=n_boot, level=level, seed=seed, strict=strict, **thresholds)
    if key:
        report_cache.store(key, run_dirs, result)
    return result

