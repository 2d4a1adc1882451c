"""`python -m fp8eval.report PATH... [--out DIR]`: the recovery report of paired runs.

The last line printed on stdout is the report directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fp8eval.core.kvargs import key_value_flags
from fp8eval.core.secrets import guard_std_streams
from fp8eval.metrics.pairing import PairingError
from fp8eval.report import write_report
from fp8eval.report.load import ReportInputError
from fp8eval.validate import InputError, validate_report_options


def parser() -> argparse.ArgumentParser:
    """The command line of `python -m fp8eval.report`."""
    p = argparse.ArgumentParser(
        prog="python -m fp8eval.report",
        description="Pair each variant arm with its baseline record by record and write recovery.csv,"
                    " report.md, index.html and figures.")
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                   help="run directories (holding summary.json) or output roots searched recursively")
    p.add_argument("--out", type=Path, default=None, help="report directory (default: <first PATH>/report)")
    p.add_argument("--gate", type=float, default=95.0, help="recovery %% a variant must keep (default 95)")
    p.add_argument("--unsure-margin", type=float, default=0.0,
                   help="points the CI's lower end may fall below the gate for a pass (default 0: non-inferiority)")
    p.add_argument("--sign-alpha", type=float, default=0.05,
                   help="one-sided sign-test level for a systematic downward shift (default 0.05)")
    p.add_argument("--shift-margin", type=float, default=1.0,
                   help="calibrate only when a task's difference CI excludes every drop smaller than this many"
                        " points (default 1)")
    p.add_argument("--right-at", type=float, default=0.5,
                   help="a record is right when its score is at least this, for flip lists (default 0.5)")
    p.add_argument("--z", type=float, default=1.96,
                   help="a bucket's gap is inside its error band when |gap| <= z * stderr (default 1.96)")
    p.add_argument("--level", type=float, default=0.95, help="CI level (default 0.95)")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--skip-mismatched", action="store_true",
                   help="leave out (and list) pairs whose prompts or task versions differ instead of stopping")
    p.add_argument("--no-cache", action="store_true",
                   help="rebuild even when the inputs are unchanged since the report was last written")
    return p


def main(argv: list[str] | None = None) -> int:
    """Write the report, print each headline verdict, decision and worth line and the report directory; returns 0, or 2
    when the inputs cannot be paired or read."""
    p = parser()  # key=value too, as the Hydra apps take them: stats.gate=90 is --gate 90 (fp8eval.core.kvargs)
    args = p.parse_args(key_value_flags(sys.argv[1:] if argv is None else argv, p, prefixes=("report", "stats")))
    try:  # every option in its range before any file is read
        validate_report_options({"--gate": args.gate, "--level": args.level, "--unsure-margin": args.unsure_margin,
                                 "--sign-alpha": args.sign_alpha, "--right-at": args.right_at, "--z": args.z,
                                 "--n-boot": args.n_boot, "--shift-margin": args.shift_margin})
    except InputError as e:
        print(f"fp8eval.report: {e}", file=sys.stderr)
        return 2
    try:
        out = write_report(args.paths, args.out, n_boot=args.n_boot, level=args.level, seed=args.seed,
                           strict=not args.skip_mismatched, gate=args.gate, unsure_margin=args.unsure_margin,
                           sign_alpha=args.sign_alpha, right_at=args.right_at, z=args.z,
                           shift_margin=args.shift_margin,
                           cache=not args.no_cache)
    except (PairingError, ReportInputError) as e:
        print(f"fp8eval.report: {e}", file=sys.stderr)
        return 2
    import json

    verdicts = json.loads((out / "verdicts.json").read_text(encoding="utf-8"))
    for r in verdicts["headline"]:
        rec = r["recovery_pct"]
        rec_s = "n/a" if rec is None else f"{rec:.1f}%"
        print(f"{r['model']} {r['task']} {r['variant']} vs {r['baseline']} [{r['group']}]: recovery {rec_s}"
              f" -> {r['verdict']}")
    for d in verdicts["decisions"]:
        print(f"{d['model']} {d['variant']}: {d['decision']}")
    worth_path = out / "worth.json"
    for w in json.loads(worth_path.read_text(encoding="utf-8")) if worth_path.is_file() else []:
        print(f"{w['model']} {w['variant']}: {w['verdict']}")
    for m in verdicts["refused"]:
        print(f"refused: {m}", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    guard_std_streams()  # every line printed, Hydra's errors included, is redacted (fp8eval.core.secrets)
    sys.exit(main())
