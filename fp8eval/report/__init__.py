"""The recovery report: records of paired arms in; recovery.csv, report.md, index.html, figures out.

`write_report(paths, out)` is what `python -m fp8eval.report PATH...` and the end of a
`python -m fp8eval` run call. Importing this module is cheap (stdlib only); pandas, numpy and
matplotlib load when a report is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable


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
    from fp8eval.report import cache as report_cache
    from fp8eval.report.load import find_run_dirs

    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("write_report needs at least one run directory or output root")
    out = (Path(out) if out is not None else paths[0] / "report").resolve()
    key = None
    if cache:
        settings = {"n_boot": n_boot, "level": level, "seed": seed, "strict": strict,
                    "thresholds": dict(sorted(thresholds.items()))}
        from fp8eval.report.worth import perf_key

        settings["perf"] = perf_key(paths)  # a new or changed perf.json rebuilds the "worth it?" view
        run_dirs = find_run_dirs(paths)
        key = report_cache.report_key(run_dirs, settings)
        if key and report_cache.restore(key, run_dirs, out):
            return out
    from fp8eval.report.build import build_report

    result = build_report(paths, out, n_boot=n_boot, level=level, seed=seed, strict=strict, **thresholds)
    if key:
        report_cache.store(key, run_dirs, result)
    return result


__all__ = ["write_report"]
