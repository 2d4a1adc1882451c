"""Benchmark 5, zero-work rerun: a finished command run again sends no engine request and exits fast.

    python benchmarks/rerun.py --engine fake                      # default niah on the fake engine
    python benchmarks/rerun.py --engine reference                 # default niah, embedded model (slow first run)
    python benchmarks/rerun.py --engine fake -- task.lengths=[256] # extra overrides after --

Runs the same `python -m fp8eval` command twice against one records dir (the first run does the work,
or finds it done) and prints wall time and requests sent by each, read from summary.json. Both write
the report, as the default command does (add `report=false` after `--` to leave it out). Target: the
rerun sends 0 requests and takes <= 2 s from process start to exit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_once(engine: str, records: Path, run_dir: Path, extra: list[str]) -> dict:
    # The default command, report included; only where records and the run directory go is changed.
    cmd = [sys.executable, "-m", "fp8eval", f"engine={engine}", f"records_dir={records}", "progress=false",
           f"hydra.run.dir={run_dir}", *extra]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    arms = summary["arms"]
    return {"wall_s": round(wall, 2), "requests_sent": sum(a["requests_sent"] for a in arms.values()),
            "records": sum(a["n_records"] for a in arms.values()), "recovery": (summary["recovery"] or {}).get("overall")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="fake", choices=["fake", "reference"])
    ap.add_argument("--workdir", type=Path, default=None, help="keeps records between invocations")
    ap.add_argument("extra", nargs="*", help="more overrides for both runs")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="fp8eval-rerun-"))
    records = work / f"records-{args.engine}"
    extra = list(args.extra) + (["engine.script=needle"] if args.engine == "fake" else [])
    first = run_once(args.engine, records, work / "run-first", extra)
    rerun = run_once(args.engine, records, work / "run-again", extra)
    out = {"engine": args.engine, "first": first, "rerun": rerun, "loadavg_1m": round(os.getloadavg()[0], 2),
           "met": rerun["requests_sent"] == 0 and rerun["wall_s"] <= 2.0}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
