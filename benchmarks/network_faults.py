"""The network cases of issue 23 through the CLI (`python -m fp8eval engine=server ...`) against hostile
loopback servers (tests/fake_openai_server.py): a 1 byte/s trickle, request_timeout_s 0 and -1, a 50 MB
answer to a 32-token request, impossible usage numbers, and a two-replica pool whose first replica cuts
every answer mid-body (or answers every generation with HTTP 500) while its /health answers. The pool
cases put `user:pass@` in the replica URLs and check that no file of the run dir and neither stream holds
the password.

    PYTHONPATH=$PWD python benchmarks/network_faults.py [--workdir DIR] [--only CASE ...]

One JSON line per case: exit code, wall seconds, the last stderr line, the arm's summary figures, the
faults the hostile server served, and `secret_found` (files or streams holding the password).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from fake_openai_server import FakeOpenAIServer  # noqa: E402

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # model=smollm2-135m's hf_id, as the server calls it
BASE = ["kv=bf16", "baseline=none", "task.lengths=[512]", "task.depths=[0,50,100]", "task.needles_per_cell=3",
        "report=false", "progress=false"]
PASSWORD = "hunter2"
KEYS = ("score", "n_records", "n_errors", "prefix_cache_hit_rate", "mean_output_tokens", "replica_pool")

# name -> (fault_fn of the first server, extra overrides, pool of two?)
CASES = {
    "clean": (None, [], False),
    "trickle_deadline_5s": (lambda b, n: "trickle", ["engine.request_timeout_s=5", "engine.max_retries=0",
                                                     "engine.concurrency=1"], False),
    "request_timeout_0": (None, ["engine.request_timeout_s=0"], False),
    "request_timeout_-1": (None, ["engine.request_timeout_s=-1"], False),
    "answer_50MB_max_tokens_32": (lambda b, n: "huge", ["sampling.max_tokens=32", "engine.max_retries=1"], False),
    "answer_50MB_first_attempt_only": (lambda b, n: "huge" if n == 1 else None, ["sampling.max_tokens=32"], False),
    "usage_negative_always": (lambda b, n: "usage_negative", ["engine.max_retries=1"], False),
    "usage_huge_always": (lambda b, n: "usage_huge", ["engine.max_retries=1"], False),
    "usage_huge_first_attempt_only": (lambda b, n: "usage_huge" if n == 1 else None, [], False),
    "pool_replica_cuts_every_answer": (lambda b, n: "cut", ["engine.max_retries=2", "engine.concurrency=2"], True),
    "pool_replica_500s_every_answer_no_eject": (lambda b, n: "500", ["engine.max_retries=1",
                                                                     "engine.eject_after=100"], True),
}


def secret_places(run_dir: Path, *texts: str) -> list[str]:
    """Files under run_dir and streams (by index) that hold the password."""
    found = [str(p) for p in run_dir.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]
    return found + [f"stream {i}" for i, t in enumerate(texts) if PASSWORD in t]


def run_case(name: str, workdir: Path) -> dict:
    """One case: start the servers, run the CLI, read its summary."""
    fault_fn, extra, pool = CASES[name]
    tmp = workdir / name
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with FakeOpenAIServer(model=MODEL) as a, FakeOpenAIServer(model=MODEL) as b:
        a.fault_fn = fault_fn
        if pool:
            urls = [u.replace("http://", f"http://alice:{PASSWORD}@") for u in (a.url, b.url)]
            target = [f"engine.base_urls.bf16=[{','.join(urls)}]"]
        else:
            target = [f"engine.base_url={a.url}"]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "fp8eval", "engine=server", *target, *BASE, *extra,
                               f"records_dir={tmp / 'records'}", f"hydra.run.dir={tmp / 'run'}"],
                              cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.monotonic() - t0
    summary = tmp / "run" / "summary.json"
    arm = json.loads(summary.read_text())["arms"]["bf16"] if summary.is_file() else None
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return {"case": name, "rc": proc.returncode, "wall_s": round(wall, 1),
            "stderr_last": lines[-1][:300] if lines else "",
            "arm": {k: arm.get(k) for k in KEYS} if arm else None, "faults": a.fault_counts,
            "secret_found": secret_places(tmp, proc.stdout, proc.stderr)}


def main() -> int:
    """Run the cases, print one JSON line each; exit 1 when a password leaked."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="/tmp/fp8eval-network-faults")
    ap.add_argument("--only", nargs="*", choices=sorted(CASES))
    args = ap.parse_args()
    leaked = False
    for name in args.only or CASES:
        row = run_case(name, Path(args.workdir))
        leaked |= bool(row["secret_found"])
        print(json.dumps(row), flush=True)
    return 1 if leaked else 0


if __name__ == "__main__":
    sys.exit(main())
