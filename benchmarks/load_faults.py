"""Load test of the records store and the server engine under faults (issue 13).

Two fake OpenAI-compatible servers on loopback (a BF16 one and an FP8 one, tests/fake_openai_server.py)
answer an AIME-format task of `--samples` invented problems x `--repeats`, so one run of both arms sends
samples x 2 requests (n = repeats each) at `--concurrency`. Each generation call independently gets, with
`--fault-rate` each, an HTTP 500, a malformed (cut) JSON body, or one choice too few.

1. Run A: uninterrupted, into its own records directory.
2. Run B: the same command into another records directory, SIGKILLed (with its scoring workers' parent)
   when a third of the records are on disk; then `python -m fp8eval.records repair` of every arm of B starts
   and, while it works, the second run of B (a run that starts during a repair: it waits for it, or the
   repair refuses it); that run is SIGKILLed at two thirds, then rerun until it finishes.
3. With --compare-commit, run A again with `records_commit_s=0` (one fsync per completion, the store before
   group commit), to compare the share of the runner's time spent in fsync (summary.json's `records_io`).

Checks: in B every (sample, repeat) of each arm has exactly one record that counts and no line of B's files
repeats one (nothing was done twice); no process of a killed run survives it; B's summary equals A's (score,
stderr, counts, groups, recovery). Prints one JSON line with the timings and counts.

    PYTHONPATH=$PWD python benchmarks/load_faults.py                      # 10,000 x 2 arms = 20,000 requests
    PYTHONPATH=$PWD python benchmarks/load_faults.py --samples 500        # the CI size (tests/faults)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from fake_openai_server import FakeOpenAIServer  # noqa: E402

from fp8eval.records import read_arm, read_records  # noqa: E402

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # model=smollm2-135m's hf_id: what the servers say they serve
COMPARED = ("score", "stderr", "n_samples", "n_repeats", "n_records", "n_scored", "n_skipped", "n_errors",
            "by_group")


def _unit(*parts) -> float:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "big") / 2**64


def make_answer(wrong_every: int):
    """A model that boxes the answer the problem states, except for 1 in `wrong_every` (seed, choice)."""
    def answer(messages, index, seed):
        m = re.search(r"The answer is (\d+)\.", messages[-1]["content"])
        k = int(m.group(1)) if m else 0
        if _unit(seed, index, "wrong") < 1.0 / wrong_every:
            k += 1
        return f"The answer is \\boxed{{{k}}}."
    return answer


def make_faults(rate: float):
    """Per call (body, attempt): 500, malformed or short_choices, each with probability `rate`."""
    def fault(body, attempt):
        u = _unit(json.dumps(body.get("messages"), sort_keys=True), body.get("seed"), attempt)
        for i, name in enumerate(("500", "malformed", "short_choices")):
            if i * rate <= u < (i + 1) * rate:
                return name
        return None
    return fault


def write_data(path: Path, n: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i:05d}", "problem": f"Problem {i}. The answer is {i % 1000}.",
                                "answer": i % 1000}) + "\n")


def _children(pid: int) -> set[int]:
    """Every descendant of pid (from /proc)."""
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _lines(records: Path) -> int:
    n = 0
    for p in records.rglob("*.jsonl"):
        if p.parent.name != "token_counts":
            with open(p, "rb") as f:
                n += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    return n


def command(args, data: Path, records: Path, urls: dict[str, str]) -> list[str]:
    return [sys.executable, "-m", "fp8eval", "engine=server", "task=aime25", f"task.data_files=[{data}]",
            f"task.repeats={args.repeats}", "sampling.temperature=0.6", "kv=fp8", "baseline=bf16", f"engine.concurrency={args.concurrency}",
            "engine.max_retries=6", f"+engine.base_urls.bf16={urls['bf16']}", f"+engine.base_urls.fp8={urls['fp8']}",
            f"records_dir={records}", "progress=false", "report=false", "scoring_workers=0"]


def fsync_share(summary: dict) -> dict:
    """fsyncs, seconds in fsync and their share of the run's wall time, over both arms."""
    io = [a.get("records_io") or {} for a in summary["arms"].values()]
    n, s = sum(x.get("fsyncs", 0) for x in io), sum(x.get("fsync_s", 0.0) for x in io)
    return {"appends": sum(x.get("appends", 0) for x in io), "fsyncs": n, "fsync_s": round(s, 2),
            "wall_s": summary["wall_s"], "share": round(s / summary["wall_s"], 4) if summary["wall_s"] else None}


def repair_during_run(args, data: Path, rec: Path, urls: dict[str, str], work: Path, kill_at: int) -> dict:
    """`records repair` of every arm of `rec`, and a run started while it works (killed at `kill_at` lines)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    t0 = time.monotonic()
    repair = subprocess.Popen([sys.executable, "-m", "fp8eval.records", "repair", str(rec)], cwd=work, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ended: list[float] = []
    threading.Thread(target=lambda: (repair.wait(), ended.append(time.monotonic())), daemon=True).start()
    claims = list(rec.glob("*/*.claims"))
    deadline = time.monotonic() + 30
    while repair.poll() is None and time.monotonic() < deadline and not any(
            (c / "arm.repair").exists() for c in claims):
        time.sleep(0.01)
    during = repair.poll() is None
    killed = run(command(args, data, rec, urls), work, kill_at=kill_at, records=rec)
    out, err = repair.communicate()
    while not ended:
        time.sleep(0.01)
    return {"repair_rc": repair.returncode, "repair_out": out.strip().splitlines(), "repair_s":
            round(ended[0] - t0, 2), "run_started_during_repair": during, "killed": killed}


def run(cmd: list[str], cwd: Path, kill_at: int | None = None, records: Path | None = None) -> dict:
    """Run one invocation; with kill_at, SIGKILL it once that many record lines are on disk."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if kill_at is None:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"run failed ({proc.returncode}):\n{err[-3000:]}")
        run_dir = cwd / out.strip().splitlines()[-1]  # printed relative to the cwd
        return {"wall_s": round(time.monotonic() - t0, 2),
                "summary": json.loads((run_dir / "summary.json").read_text())}
    while proc.poll() is None and _lines(records) < kill_at:
        time.sleep(0.2)
    kids = _children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    time.sleep(1.0)
    survivors = sorted(p for p in kids if _alive(p))
    return {"wall_s": round(time.monotonic() - t0, 2), "killed_at_lines": _lines(records),
            "children": len(kids), "survivors": survivors}


def exactly_once(summary: dict, expected: int) -> dict:
    """Per arm: records that count, and raw lines per (sample, repeat) over all of the arm's files."""
    out = {}
    for kv, arm in summary["arms"].items():
        base = Path(arm["records"])
        view = read_arm(base, arm["fingerprint"], "aime25")
        # lines `repair` moved aside count too: a pair done twice would show there
        files = [base, *sorted(base.with_suffix(".seg").glob("*.jsonl")), base.with_suffix(".rejected.jsonl")]
        keys = [(r["sample_id"], r["repeat"]) for p in files if p.exists() for r in read_records(p)
                if r.get("arm") == arm["fingerprint"]]
        out[kv] = {"counted": len(view.records), "expected": expected, "lines": len(keys),
                   "repeated_lines": len(keys) - len(set(keys)), "errors": arm["n_errors"],
                   "ignored": view.ignored}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--fault-rate", type=float, default=0.01)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--compare-commit", action="store_true",
                    help="also run A with records_commit_s=0 (one fsync per completion) to compare fsync time")
    args = ap.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fp8eval-load-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "problems.jsonl"
    write_data(data, args.samples)
    servers = {"bf16": FakeOpenAIServer(model=MODEL, keep_bodies=False),
               "fp8": FakeOpenAIServer(model=MODEL, cache_dtype="fp8", keep_bodies=False)}
    servers["bf16"].answer_fn = make_answer(wrong_every=10)
    servers["fp8"].answer_fn = make_answer(wrong_every=5)
    for s in servers.values():
        s.fault_fn = make_faults(args.fault_rate)
        s.start()
    urls = {k: s.url for k, s in servers.items()}
    total = args.samples * args.repeats * 2
    try:
        a = run(command(args, data, work / "records_a", urls), work)
        calls_a = {k: s.generation_calls for k, s in servers.items()}
        faults_a = {k: dict(s.fault_counts) for k, s in servers.items()}
        for s in servers.values():
            s.generation_calls, s.fault_counts, s.attempts = 0, {}, {}
        rec_b = work / "records_b"
        first = run(command(args, data, rec_b, urls), work, kill_at=int(total / 3), records=rec_b)
        middle = repair_during_run(args, data, rec_b, urls, work, kill_at=int(total * 2 / 3))
        kills = [first, middle.pop("killed")]
        b = run(command(args, data, rec_b, urls), work)
        calls_b = {k: s.generation_calls for k, s in servers.items()}
        faults_b = {k: dict(s.fault_counts) for k, s in servers.items()}
        a0 = (run(command(args, data, work / "records_a0", urls) + ["records_commit_s=0"], work)
              if args.compare_commit else None)
    finally:
        for s in servers.values():
            s.stop()
    sa, sb = a["summary"], b["summary"]
    diffs = [f"{kv}.{k}" for kv in sa["arms"] for k in COMPARED if sa["arms"][kv][k] != sb["arms"][kv][k]]
    if sa["recovery"] != sb["recovery"]:
        diffs.append("recovery")
    once = exactly_once(sb, args.samples * args.repeats)
    ok = (not diffs and all(v["counted"] == v["expected"] and v["repeated_lines"] == 0 and v["errors"] == 0
                            for v in once.values())
          and not any(k["survivors"] for k in kills) and middle["repair_rc"] in (0, 1))
    result = {
        "benchmark": "load_faults", "samples": args.samples, "repeats": args.repeats,
        "requests_per_run": args.samples * 2, "records_per_run": total, "concurrency": args.concurrency,
        "fault_rate_each": args.fault_rate, "uninterrupted": {"wall_s": a["wall_s"], "calls": calls_a,
                                                              "faults": faults_a},
        "killed": kills, "resumed": {"wall_s": b["wall_s"],
                                     "requests_sent": {k: v["requests_sent"] for k, v in sb["arms"].items()}},
        "calls_b": calls_b,
        # generation calls the killed runs made whose answers were never written (in flight or waiting)
        "extra_calls_b_vs_a": sum(calls_b.values()) - sum(calls_a.values()),
        "faults_b": faults_b,
        "repair_in_the_middle": middle,
        "fsync": {"group_commit": fsync_share(sa), **({"per_completion": fsync_share(a0["summary"]),
                                                      "per_completion_wall_s": a0["wall_s"]} if a0 else {})},
        "exactly_once": once, "score": {k: v["score"] for k, v in sb["arms"].items()},
        "recovery": sb["recovery"]["overall"], "summary_diffs": diffs, "ok": ok,
    }
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
