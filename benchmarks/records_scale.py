"""Scale of the records reader (issue 23): `records check` of a ~200 MB arm, and the rerun of a finished
10-sample job whose arm holds those ~200 MB (a larger grid's records reused), in wall time and peak RSS.

1. A 10-sample NIAH job on the fake engine (`task.lengths=[1024]`, ten depths) fills its two arms.
2. The fp8 arm gets records of other samples appended (same arm fingerprint, ~2 KB each, as a larger
   grid would have written) until it holds `--mb` MB.
3. Timed, each in a fresh process, peak RSS from the kernel (wait4): `python -m fp8eval.records check ARM`
   (every line parsed), and the same 10-sample command again, twice (each must send 0 requests;
   `report=false`: the report is timed by its own benchmark). The first rerun parses the ~200 MB that were
   appended outside any run and writes the arm file's index (fp8eval.records.index), as the larger grid's
   own last read would have; the second is the rerun of a finished arm, which parses only what was appended
   after the index (nothing here) and reads the 10 winners' lines.

    PYTHONPATH=$PWD python benchmarks/records_scale.py --workdir /tmp/rs          # this checkout
    PYTHONPATH=$PWD python benchmarks/records_scale.py --workdir /tmp/rs --src OLD_CHECKOUT   # another one
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

REPO = Path(__file__).resolve().parents[1]
JOB = ["engine=fake", "task.lengths=[1024]", "task.depths=[0,10,20,30,40,50,60,70,80,90]", "report=false",
       "progress=false"]


def timed(cmd: list[str], cwd: Path, src: Path) -> dict:
    """Run `cmd`; wall seconds, peak RSS (MB) of the process, exit status and its stdout."""
    # src first; what PYTHONPATH already holds stays after it (a dependency installed outside the venv)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])]))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate()
    wall = time.monotonic() - t0
    return {"wall_s": round(wall, 2), "rc": proc.returncode, "stdout": out.decode(), "stderr": err.decode()[-2000:]}


HELPER = r"""
import json, os, resource, subprocess, sys, time
cmd = json.loads(sys.argv[1])
t0 = time.monotonic()
p = subprocess.run(cmd, capture_output=True)
wall = time.monotonic() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": round(wall, 2), "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
                  "max_rss_mb": round(ru.ru_maxrss / 1024, 1), "rc": p.returncode,
                  "stdout": p.stdout.decode()[-4000:], "stderr": p.stderr.decode()[-2000:]}))
"""


def measure(cmd: list[str], cwd: Path, src: Path) -> dict:
    """wall seconds and peak RSS of `cmd` alone (it is the only child of a helper process)."""
    got = timed([sys.executable, "-c", HELPER, json.dumps(cmd)], cwd, src)
    return json.loads(got["stdout"])


def grow(arm: Path, mb: float) -> int:
    """Append records of other samples of the same arm until the file holds `mb` MB; returns how many."""
    template = json.loads(arm.read_text(encoding="utf-8").splitlines()[0])
    filler = ("The needle is somewhere in this long answer. " * 40)[:1800]
    n = 0
    target = int(mb * 1e6)
    with open(arm, "a", encoding="utf-8") as f:
        while f.tell() < target:
            lines = []
            for _ in range(1000):
                n += 1
                lines.append(json.dumps({**template, "sample_id": f"grid-{n:07d}", "prompt_hash": f"p{n}",
                                         "completion": f"{n} {filler}"}, sort_keys=True))
            f.write("\n".join(lines) + "\n")
    return n


def main(argv: list[str] | None = None) -> int:
    """Build the arm, time check and rerun, print one JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=200.0)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--src", type=Path, default=REPO, help="checkout whose fp8eval is measured")
    ap.add_argument("--with-report", action="store_true", help="also time the rerun with report=true")
    args = ap.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fp8eval-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    records = work / "records"
    job = [sys.executable, "-m", "fp8eval", *JOB, f"records_dir={records}"]
    first = measure(job, work, args.src)
    if first["rc"] != 0:
        raise SystemExit(f"the job failed: {first['stderr']}")
    run_dir = work / first["stdout"].strip().splitlines()[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    arm = Path(summary["arms"]["fp8"]["records"])
    added = grow(arm, args.mb)
    check = measure([sys.executable, "-m", "fp8eval.records", "check", str(arm)], work, args.src)
    rerun_first = measure(job, work, args.src)
    index = arm.with_name(arm.name + ".index")
    index_mb = round(index.stat().st_size / 1e6, 1) if index.exists() else None
    rerun = measure(job, work, args.src)
    rerun_dir = work / rerun["stdout"].strip().splitlines()[-1]
    again = json.loads((rerun_dir / "summary.json").read_text())
    same = all(again["arms"][k]["score"] == summary["arms"][k]["score"] for k in summary["arms"])
    # the rerun through the index counts exactly what the first rerun's full read counted
    full = json.loads((work / rerun_first["stdout"].strip().splitlines()[-1] / "summary.json").read_text())
    same_as_full = all({f: again["arms"][k].get(f) for f in ("score", "stderr", "n_ignored", "n_records", "n_scored", "by_group")}
                       == {f: full["arms"][k].get(f) for f in ("score", "stderr", "n_ignored", "n_records", "n_scored", "by_group")}
                       for k in full["arms"])
    with_report = (measure([*[a for a in job if a != "report=false"], "report=true"], work, args.src)
                   if args.with_report else None)
    result = {
        "benchmark": "records_scale", "src": str(args.src), "arm_mb": round(arm.stat().st_size / 1e6, 1),
        "records_added": added, "load_avg_1m": os.getloadavg()[0],
        "check": {k: check[k] for k in ("wall_s", "cpu_s", "max_rss_mb", "rc")},
        "rerun_first": {k: rerun_first[k] for k in ("wall_s", "cpu_s", "max_rss_mb", "rc")},
        "index_mb": index_mb,
        "rerun": {k: rerun[k] for k in ("wall_s", "cpu_s", "max_rss_mb", "rc")},
        "rerun_requests_sent": {k: a["requests_sent"] for k, a in again["arms"].items()},
        **({"rerun_with_report": {k: with_report[k] for k in ("wall_s", "cpu_s", "max_rss_mb", "rc")}}
           if with_report else {}),
        "rerun_same_scores": same,
        "rerun_same_counts_as_full_read": same_as_full,
    }
    print(json.dumps(result))
    return 0 if rerun["rc"] == 0 and rerun_first["rc"] == 0 and same and same_as_full and not any(result["rerun_requests_sent"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
