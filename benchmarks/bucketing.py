"""Benchmark: bucketing MRCR-sized data by o200k_base tokens, first run (build) and second (cached).

    python benchmarks/bucketing.py all --rows-per-bin 100 --workdir /tmp/mrcr-bench

writes 3 needle counts x 8 bins x rows-per-bin synthetic rows (100 = the real set's 2,400 rows, about
2 GB of JSON lines, rows up to ~4 MB), then runs the manifest build twice in fresh processes and
prints wall time and peak resident memory of the bucketing process and of its largest worker.
Rows are sized by characters (4.4 chars per o200k token, the haystack books' ratio) so that generating
them does not cost a second tokenisation; the manifest then counts them exactly.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

CHARS_PER_TOKEN = 4.4


def generate(out: Path, rows_per_bin: int, seed: int) -> None:
    from fp8eval.metrics.auc import MRCR_LABELS
    from fp8eval.tasks.mrcr.synth import synth_rows, write_jsonl

    t0 = time.perf_counter()
    write_jsonl(
        synth_rows(MRCR_LABELS, [2, 4, 8], rows_per_bin, seed=seed,
                   count_tokens=lambda text: int(len(text) / CHARS_PER_TOKEN)),
        out,
    )
    print(json.dumps({"phase": "generate", "seconds": round(time.perf_counter() - t0, 1),
                      "bytes": out.stat().st_size}))


def bucket(data: Path, manifest_dir: Path, workers: int | None) -> None:
    from collections import Counter

    from fp8eval.tasks.mrcr.data import files_sha256, load_or_build_manifest

    t0 = time.perf_counter()
    refs, path, built = load_or_build_manifest([data], {"local_files": files_sha256([data])},
                                               manifest_dir, workers=workers)
    seconds = time.perf_counter() - t0
    kib = 1024  # ru_maxrss is in KiB on Linux
    print(json.dumps({
        "phase": "bucket", "built": built, "seconds": round(seconds, 2), "rows": len(refs),
        "o200k_tokens": sum(r.n_tokens for r in refs),
        "max_row_chars": max(r.n_chars for r in refs),
        "peak_rss_mib_main": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / kib, 1),
        "peak_rss_mib_largest_worker": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / kib, 1),
        "rows_per_bucket": dict(Counter(f"{r.n_needles}n/{r.bucket}" for r in refs)),
        "manifest_bytes": path.stat().st_size,
    }))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=["generate", "bucket", "all"])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/mrcr-bench"))
    ap.add_argument("--rows-per-bin", type=int, default=100)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    data = args.workdir / f"rows-{args.rows_per_bin}.jsonl"
    manifests = args.workdir / "manifests"
    if args.phase == "generate":
        generate(data, args.rows_per_bin, args.seed)
    elif args.phase == "bucket":
        bucket(data, manifests, args.workers)
    else:
        # each phase in a fresh process, so peak memory is that phase's alone
        base = [sys.executable, __file__, "--workdir", str(args.workdir),
                "--rows-per-bin", str(args.rows_per_bin), "--seed", str(args.seed)]
        if args.workers:
            base += ["--workers", str(args.workers)]
        if not data.is_file():
            subprocess.run(base[:2] + ["generate"] + base[2:], check=True)
        for old in manifests.glob("mrcr-*.json"):
            old.unlink()
        for run in ("first (builds)", "second (cached)"):
            t0 = time.perf_counter()
            subprocess.run(base[:2] + ["bucket"] + base[2:], check=True)
            print(json.dumps({"phase": f"bucket process, {run}", "wall_s": round(time.perf_counter() - t0, 2)}))


if __name__ == "__main__":
    main()
