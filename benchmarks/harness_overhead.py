"""Benchmark 1, harness overhead: MATH-500 x 5 repeats (2,500 (sample, repeat) pairs) on the fake engine,
fully scored by the real scorer with records written, timed from process start to exit.

    python benchmarks/harness_overhead.py                # the full job, each job once
    python benchmarks/harness_overhead.py --limit 4 --repeats 2   # smoke size

Jobs (each a fresh `python -m fp8eval` process with its own empty records dir, so nothing is reused):
- `oracle`: completions from benchmarks/math_oracle.py (worked solutions, ~60% right, wrong answers
  varying by repeat), so math-verify runs on every answer the cheap checks cannot decide;
- `dummy`: a constant junk completion (what lm-eval's and lighteval's dummy models return), the job the
  reference figures below measured;
each with `scoring_workers` auto (one per core) and 0 (inline). Prints one JSON line per job with wall
time, CPU seconds of the process tree, the load average and the scoring methods used.

Peers, side by side in the same run: lm-eval and lighteval run the same job (MATH-500 from
tasks/math500/test.jsonl, `--limit`/`--repeats` honoured, every completion scored, per-sample records
written) with their dummy models, each once as a fresh process in its own empty work dir, hub off
(HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1, a fresh datasets cache). This script installs neither: a peer runs
with `--lm-eval-python` / `--lighteval-python` (a virtualenv's python that has it), else with this
interpreter if it has the package; otherwise, or if its run fails, its reference figure (measured on this
machine for the issue) stands in. One JSON line per peer run: wall time (process start to exit), CPU
seconds, exit code, the score it reports and the command. Task files: benchmarks/peers/ (README there).
- lm-eval: `python -m lm_eval run --model dummy --tasks math500_local --include_path DIR`, the task being its
  shipped minerva_math500 with a local dataset, `repeats` and a take_first_k filter so all repeats are
  scored (exact_match + math_verify, mean over repeats);
- lighteval: `lighteval custom dummy benchmarks/peers/lighteval_dummy_model.py "math500_local|0"
  --custom-tasks benchmarks/peers/lighteval_math500.py` through benchmarks/peers/lighteval_offline.py,
  the task being its shipped math_500 with a local dataset and pass@k (k=1, n=repeats).
On the full job, the best `dummy` wall time is compared with the fastest peer / 5 (measured where a peer
ran, reference figure otherwise).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_S = {"lm-eval 0.4.13": 24.2, "lighteval 0.13.0": 25.8, "pure-Python floor": 0.08}
SCRIPTS = {"oracle": "benchmarks.math_oracle:answer", "dummy": "const:lol"}
PEERS_DIR = ROOT / "benchmarks" / "peers"
MATH500_DIR = ROOT / "tasks" / "math500"
PEERS = {"lm-eval 0.4.13": ("lm_eval", "lm-eval"), "lighteval 0.13.0": ("lighteval", "lighteval")}  # module, dist
PEER_TIMEOUT_S = 1800


def run_job(script: str, workers: str, limit: int | None, repeats: int, seed: int, work: Path) -> dict:
    records = work / f"records-{script.replace(':', '_')}-{workers}"
    shutil.rmtree(records, ignore_errors=True)
    cmd = [sys.executable, "-m", "fp8eval", "task=math500", "engine=fake", "baseline=none",
           f"task.repeats={repeats}", f"engine.script={script}", f"seed={seed}", f"records_dir={records}",
           f"scoring_workers={workers}", "progress=false", "report=false", f"hydra.run.dir={work / 'run'}"]
    if limit:
        cmd.append(f"task.limit={limit}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"job failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    methods: collections.Counter = collections.Counter()
    n = 0
    for path in glob.glob(str(records / "math500" / "*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                n += 1
                methods[rec["score_details"].get("method", rec["status"])] += 1
    return {"records": n, "wall_s": round(wall, 2),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
            "methods": dict(methods)}


def _peer_python(module: str, dist: str, python: str | None) -> tuple[str | None, str | None]:
    """(interpreter, installed version) for a peer: `python` if given, else this interpreter; None if it lacks it."""
    exe = python or sys.executable
    if python and not os.path.exists(python):
        return None, None
    probe = (f"import importlib.util, importlib.metadata as m; "
             f"print(m.version({dist!r}) if importlib.util.find_spec({module!r}) else '')")
    try:
        out = subprocess.run([exe, "-c", probe], check=False, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    version = out.stdout.strip() if out.returncode == 0 else ""
    return (exe, version) if version else (None, None)


def _lm_eval_cmd(py: str, limit: int | None, repeats: int, work: Path) -> tuple[list[str], dict]:
    # The task YAML and its hooks, copied with the dataset path made absolute and repeats (and the
    # take_first_k filter's k) set; lm-eval resolves `!function math500_local.x` next to the YAML.
    tasks = work / "tasks"
    tasks.mkdir()
    text = (PEERS_DIR / "lmeval" / "math500_local.yaml").read_text(encoding="utf-8")
    for pattern, value in ((r"(?m)^(\s*test: ).*$", json.dumps(str(MATH500_DIR / "test.jsonl"))),
                           (r"(?m)^(repeats: ).*$", str(repeats)), (r"(?m)^(\s*k: ).*$", str(repeats))):
        text, n = re.subn(pattern, lambda m, v=value: m.group(1) + v, text)
        assert n == 1, pattern
    (tasks / "math500_local.yaml").write_text(text, encoding="utf-8")
    shutil.copy(PEERS_DIR / "lmeval" / "math500_local.py", tasks / "math500_local.py")
    cmd = [py, "-m", "lm_eval", "run", "--model", "dummy", "--tasks", "math500_local", "--include_path", str(tasks),
           "--output_path", str(work / "out"), "--log_samples"]
    if limit:
        cmd += ["--limit", str(limit)]
    return cmd, {}


def _lighteval_cmd(py: str, limit: int | None, repeats: int, work: Path) -> tuple[list[str], dict]:
    cmd = [py, str(PEERS_DIR / "lighteval_offline.py"), "custom", "dummy", str(PEERS_DIR / "lighteval_dummy_model.py"),
           "math500_local|0", "--custom-tasks", str(PEERS_DIR / "lighteval_math500.py"),
           "--output-dir", str(work / "out"), "--save-details"]
    if limit:
        cmd += ["--max-samples", str(limit)]
    return cmd, {"MATH500_DATA_DIR": str(MATH500_DIR), "MATH500_REPEATS": str(repeats),
                 "LIGHTEVAL_DUMMY_CACHE_DIR": str(work / "response-cache")}


def _peer_score(name: str, out: Path) -> dict:
    """The scores the peer wrote to its results JSON (junk answers: ~0)."""
    scores: dict = {}
    for path in glob.glob(str(out / "**" / "results_*.json"), recursive=True):
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
        if name.startswith("lm-eval"):
            task = results["results"].get("math500_local", {})
            scores.update({k: v for k, v in task.items() if "," in k and "stderr" not in k})
            scores["samples"] = results.get("n-samples", {}).get("math500_local", {}).get("effective")
        else:
            scores.update({k: v for k, v in results["results"].get("all", {}).items() if "stderr" not in k})
    return scores


def run_peer(name: str, py: str, version: str, limit: int | None, repeats: int, work: Path) -> dict:
    """One run of a peer harness on the job, as a fresh process in an empty dir, timed from start to exit."""
    peer_work = work / ("peer-" + name.split()[0])
    shutil.rmtree(peer_work, ignore_errors=True)
    peer_work.mkdir(parents=True)
    build = _lm_eval_cmd if name.startswith("lm-eval") else _lighteval_cmd
    cmd, extra_env = build(py, limit, repeats, peer_work)
    extra_env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                 "HF_DATASETS_CACHE": str(peer_work / "hf-datasets"), **extra_env}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the peer's own environment only
    env.update(extra_env)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, check=False, cwd=peer_work, env=env, capture_output=True, text=True,
                              timeout=PEER_TIMEOUT_S)
        rc, err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr or ""
        err = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr
        rc = f"timeout after {PEER_TIMEOUT_S} s"
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = {"peer": name, "version": version, "ok": rc == 0, "rc": rc, "wall_s": round(wall, 2),
           "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
           "loadavg_1m": round(os.getloadavg()[0], 2),
           "requests": (limit or 500) * repeats,
           "cmd": " ".join(f"{k}={shlex.quote(v)}" for k, v in extra_env.items()) + " " + shlex.join(cmd)}
    if rc == 0:
        res["scores"] = _peer_score(name, peer_work / "out")
    else:
        res["error_tail"] = err[-1500:]
    return res


def other_harnesses(args: argparse.Namespace, work: Path) -> dict:
    """Wall times of lm-eval / lighteval run on the same job where available, else the issue's reference figures."""
    pythons = {"lm-eval 0.4.13": args.lm_eval_python, "lighteval 0.13.0": args.lighteval_python}
    found, measured = {}, {}
    for name, (module, dist) in PEERS.items():
        py, version = _peer_python(module, dist, pythons[name])
        found[name] = bool(py)
        if not py:
            if pythons[name]:
                print(json.dumps({"peer": name, "note": f"{pythons[name]} cannot import {module}; reference figure"}))
            continue
        res = run_peer(name, py, version, args.limit, args.repeats, work)
        print(json.dumps(res))
        if res["ok"]:
            measured[name] = res["wall_s"]
    return {"reference_wall_s": REFERENCE_S, "installed": found, "measured_wall_s": measured}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="samples (default: all 500)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--jobs", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS))
    ap.add_argument("--workers", nargs="+", default=["null", "0"], help="scoring_workers values to time")
    ap.add_argument("--seed", type=int, default=int(time.time()), help="fresh by default: nothing reused")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--lm-eval-python", default=None,
                    help="python of an environment with lm-eval (default: this one, if it has lm_eval)")
    ap.add_argument("--lighteval-python", default=None,
                    help="python of an environment with lighteval (default: this one, if it has lighteval)")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="fp8eval-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    machine = {"nproc": os.cpu_count(), "loadavg_start": os.getloadavg()}
    print(json.dumps({"machine": machine}))
    best = None
    for job in args.jobs:
        for workers in args.workers:
            res = run_job(SCRIPTS[job], workers, args.limit, args.repeats, args.seed, work)
            res.update(job=job, scoring_workers=workers, loadavg_1m=round(os.getloadavg()[0], 2))
            print(json.dumps(res))
            if job == "dummy":
                best = res["wall_s"] if best is None else min(best, res["wall_s"])
    ref = other_harnesses(args, work)
    print(json.dumps(ref))
    if best is not None and not args.limit:
        peers = {k: ref["measured_wall_s"].get(k, v) for k, v in REFERENCE_S.items() if "floor" not in k}
        fastest = min(peers, key=peers.get)
        target = peers[fastest] / 5
        print(json.dumps({"dummy_job_best_wall_s": best, "target_s": round(target, 2), "met": best <= target,
                          "target_from": f"{fastest} {'measured' if fastest in ref['measured_wall_s'] else 'reference'}"
                                         f" {peers[fastest]} s / 5"}))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
