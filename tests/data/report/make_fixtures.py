"""Writes the report's frozen test fixtures (invented data, deterministic). Run from the repo root:

    PYTHONPATH=. python tests/data/report/make_fixtures.py

- golden/: one model, task `toy`, arms bf16 and fp8, 6 samples × 2 repeats, small enough that every
  number of `golden/expected_recovery.csv` can be checked by hand (tests/test_report.py does).
- `--demo DIR`: an output root with two models and needle, MRCR-like and reasoning-like tasks, for the
  figures and the browser test (built by the tests in a temp dir; not committed). The numbers are
  invented; nothing here was measured.

The layout mirrors a real project: Hydra run dirs under outputs/<date>/<time>/ and the records store
under outputs/records/<task>/<fingerprint[:20]>.jsonl, named in summary.json relative to the project
root (the directory the run started in).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

from fp8eval.records import canonical_json, fingerprint_hash
from fp8eval.core.seeds import derive_seed, rng_for

HERE = Path(__file__).resolve().parent
KV = {
    "bf16": {"name": "bf16", "engine_args": {"kv_cache_dtype": "auto"}},
    "fp8": {"name": "fp8", "engine_args": {"kv_cache_dtype": "fp8"}},
    "fp8_skip2": {"name": "fp8_skip2", "engine_args": {"kv_cache_dtype": "fp8",
                                                       "kv_cache_dtype_skip_layers": [0, 1]}},
}


def _prompt_hash(task: str, sample_id: str, repeat: int, varies: bool) -> str:
    key = f"{task}|{sample_id}|{repeat if varies else 0}"
    return hashlib.sha256(key.encode()).hexdigest()


def record(fp, kv, task, version, sample_id, repeat, seed, groups, status, score, *, finish="stop",
           varies=False, completion=None, extracted=None):
    return {
        "schema": 1, "arm": fp, "kv": kv, "task": task, "task_version": version, "sample_id": sample_id,
        "repeat": repeat, "seed": derive_seed(sample_id, repeat, seed), "groups": list(groups),
        "prompt_hash": _prompt_hash(task, sample_id, repeat, varies), "prompt_tokens": 100,
        "cached_prompt_tokens": None, "sampling": {"temperature": 0.6, "top_p": 0.95},
        "status": status, "skip_reason": "prompt does not fit max_model_len" if status == "skipped" else None,
        "completion": completion if status == "ok" else None, "reasoning": None,
        "finish_reason": (finish if status == "ok" else "error" if status == "error" else None),
        "output_tokens": 12 if status == "ok" else 0, "score": score if status == "ok" else None,
        "extracted": extracted, "score_details": {}, "latency_s": 0.5,
        "time": "2026-01-01T00:00:00+00:00",
    }


def auc(scores_by_edge: dict[int, float], up_to: int) -> float:
    """Same definition as the report's fallback (issue 4); only used to fill summary.json."""
    edges = sorted(e for e in scores_by_edge if 8192 <= e <= up_to)
    area = sum((hi - lo) * (scores_by_edge[lo] + scores_by_edge[hi]) / 2 for lo, hi in zip(edges, edges[1:]))
    return area / (up_to - 8192)


def summarize_arm(recs: list[dict], path: str, fp: str, requests: int) -> dict:
    ok = [r for r in recs if r["status"] == "ok"]
    mean = sum(r["score"] for r in ok) / len(ok) if ok else 0.0
    reps = sorted({r["repeat"] for r in ok})
    by_rep = [sum(r["score"] for r in ok if r["repeat"] == k) / max(1, sum(r["repeat"] == k for r in ok))
              for k in reps]
    if len(by_rep) > 1:
        m = sum(by_rep) / len(by_rep)
        stderr = math.sqrt(sum((x - m) ** 2 for x in by_rep) / (len(by_rep) - 1) / len(by_rep))
    else:
        vals = [r["score"] for r in ok]
        stderr = math.sqrt(sum((x - mean) ** 2 for x in vals) / max(1, len(vals) - 1) / max(1, len(vals)))
    groups = sorted({g for r in ok for g in r["groups"]})
    by_group = {g: sum(r["score"] for r in ok if g in r["groups"]) / sum(g in r["groups"] for r in ok)
                for g in groups}
    return {
        "score": mean, "stderr": stderr, "n_samples": len({r["sample_id"] for r in ok}),
        "n_repeats": len(reps), "by_group": by_group, "records": path, "fingerprint": fp,
        "requests_sent": requests, "n_records": len(recs),
        "n_skipped": sum(r["status"] == "skipped" for r in recs),
        "n_errors": sum(r["status"] == "error" for r in recs),
        "length_cutoff_rate": (sum(r["finish_reason"] == "length" for r in ok) / len(ok)) if ok else 0.0,
    }


def config_yaml(model: str, kv: str, task: str, repeats: int, seed: int, baseline: str) -> str:
    kvc = KV[kv]
    args = ", ".join(f"{k}: {json.dumps(v)}" for k, v in kvc["engine_args"].items())
    return (
        f"model:\n  name: {model}\n  hf_id: fixtures/{model}\n  revision: null\n  max_model_len: 131072\n"
        f"  engine_args: {{}}\n"
        f"kv:\n  name: {kv}\n  description: ''\n  engine_args: {{{args}}}\n  scales: null\n"
        f"engine:\n  kind: fake\n  engine_args: {{}}\n"
        f"task:\n  name: {task}\n  repeats: {repeats}\n  limit: null\n"
        f"sampling:\n  temperature: null\nseed: {seed}\nbaseline: {baseline}\n"
        f"records_dir: outputs/records\nprogress: false\nreport: true\n")


def write_run(root: Path, stamp: str, model: str, task: str, version: str, variant: str, repeats: int,
              seed: int, arms: dict[str, list[dict]], fps: dict[str, str], extras: dict[str, dict]) -> None:
    run_dir = root / "outputs" / "2026-01-01" / stamp
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    (run_dir / ".hydra" / "config.yaml").write_text(config_yaml(model, variant, task, repeats, seed, "bf16"))
    summary = {"model": model, "task": task, "baseline": "bf16", "arms": {}, "recovery": {}}
    for kv, recs in arms.items():
        rel = f"outputs/records/{task}/{fps[kv][:20]}.jsonl"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(canonical_json(r) + "\n" for r in recs))
        requests = len({r["sample_id"] for r in recs if r["status"] != "skipped"})
        summary["arms"][kv] = {**summarize_arm(recs, rel, fps[kv], requests), **extras.get(kv, {})}
    b, v = summary["arms"]["bf16"], summary["arms"][variant]
    summary["recovery"] = {"overall": 100 * v["score"] / b["score"] if b["score"] else None,
                           "by_group": {g: 100 * v["by_group"][g] / b["by_group"][g]
                                        for g in b["by_group"] if b["by_group"][g] and g in v["by_group"]}}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def fp_of(model: str, kv: str, task: str, version: str) -> str:
    return fingerprint_hash({"model": model, "kv": KV[kv], "task": task, "task_version": version,
                             "engine": "fake"})


# --- golden -------------------------------------------------------------------------------------------
GOLDEN = {  # sample: (groups, baseline per repeat, variant per repeat); None = error, "skip" = skipped
    "s1": (["level=easy"], [1.0, 1.0], [1.0, 1.0]),
    "s2": (["level=easy"], [1.0, 0.0], [1.0, 0.0]),
    "s3": (["level=hard"], [1.0, 1.0], [0.0, 1.0]),
    "s4": (["level=hard"], [0.0, 1.0], [0.0, 0.0]),
    "s5": (["level=hard"], ["skip", "skip"], ["skip", "skip"]),
    "s6": (["level=easy"], [1.0, 1.0], [1.0, None]),
}


def make_golden(root: Path) -> None:
    model, task, version = "fixture-model-a", "toy", "1"
    fps = {kv: fp_of(model, kv, task, version) for kv in ("bf16", "fp8")}
    arms: dict[str, list[dict]] = {"bf16": [], "fp8": []}
    for sid, (groups, b, v) in GOLDEN.items():
        for kv, scores in (("bf16", b), ("fp8", v)):
            for rep, s in enumerate(scores):
                status = "skipped" if s == "skip" else "error" if s is None else "ok"
                # One cut-off completion per arm, so the cutoff-rate columns have something to count.
                finish = "length" if (sid, rep, kv) in {("s4", 0, "bf16"), ("s3", 0, "fp8")} else "stop"
                arms[kv].append(record(fps[kv], kv, task, version, sid, rep, 7, groups, status,
                                       s if status == "ok" else None, finish=finish,
                                       completion=f"answer {int(s or 0)}" if status == "ok" else None,
                                       extracted=str(int(s)) if status == "ok" else None))
    write_run(root, "10-00-00", model, task, version, "fp8", 2, 7, arms, fps, {})


# --- demo ---------------------------------------------------------------------------------------------
MRCR_EDGES = [8192 * 2**i for i in range(8)]  # 8k ... 1M


def _label(edge: int) -> str:
    return f"{edge // 1048576}M" if edge >= 1048576 else f"{edge // 1024}k"


def _draw(rng, p: float) -> float:
    return 1.0 if rng.random() < p else 0.0


def demo_mrcr(root, stamp, model, max_edge, variants: dict[str, float]):
    """MRCR-like: pass@1 falls with context; each variant multiplies the baseline's probability."""
    task, version, repeats = "mrcr", "1", 3
    all_kv = ["bf16", *variants]
    fps = {kv: fp_of(model, kv, task, version) for kv in all_kv}
    arms = {kv: [] for kv in all_kv}
    for bi, edge in enumerate(MRCR_EDGES):
        for j in range(6):
            sid = f"mrcr-{_label(edge)}-{j}"
            base_p = max(0.05, 0.92 - 0.09 * bi) * (0.7 + 0.6 * rng_for("difficulty", sid).random())
            for rep in range(repeats):
                for kv in all_kv:
                    if edge > max_edge:
                        arms[kv].append(record(fps[kv], kv, task, version, sid, rep, 11, [_label(edge)],
                                               "skipped", None))
                        continue
                    p = min(1.0, base_p * (1.0 if kv == "bf16" else variants[kv]))
                    # Common random numbers: the same draw for both arms, as a paired design gives.
                    u = rng_for("mrcr", model, sid, rep).random()
                    if kv != "bf16" and rng_for("discord", model, kv, sid, rep).random() < 0.15:
                        u = rng_for("mrcr-own", model, kv, sid, rep).random()  # some pairs disagree
                    partial = round(rng_for("ratio", model, sid, rep).uniform(0.1, 0.6), 4)
                    score = 1.0 if u < p else partial
                    arms[kv].append(record(fps[kv], kv, task, version, sid, rep, 11, [_label(edge)], "ok",
                                           score, completion="…", extracted=None))
    extras = {}
    for kv in all_kv:
        ok = [r for r in arms[kv] if r["status"] == "ok"]
        by_edge = {e: sum(r["score"] for r in ok if r["groups"] == [_label(e)])
                   / sum(r["groups"] == [_label(e)] for r in ok) for e in MRCR_EDGES if e <= max_edge}
        extras[kv] = {"auc": auc(by_edge, max(by_edge)), "auc_1m": auc(by_edge, MRCR_EDGES[-1])}
    for i, kv in enumerate(variants):
        sub = {"bf16": arms["bf16"], kv: arms[kv]}
        write_run(root, f"{stamp}-{i}", model, task, version, kv, repeats, 11, sub, fps, extras)


def demo_niah(root, stamp, model, variant_drop: float):
    task, version = "niah", "1"
    fps = {kv: fp_of(model, kv, task, version) for kv in ("bf16", "fp8")}
    arms = {"bf16": [], "fp8": []}
    for ctx in (2048, 4096, 8192, 16384, 32768):
        for depth in (0, 25, 50, 75, 100):
            for j in range(2):
                sid = f"niah-c{ctx}-d{depth}-{j}"
                base_p = 0.98 - (0.25 if ctx >= 16384 and 25 <= depth <= 75 else 0.0)
                for kv in ("bf16", "fp8"):
                    p = base_p - (variant_drop if kv == "fp8" and ctx == 32768 else 0.0)
                    u = rng_for("niah", model, sid).random()
                    s = 1.0 if u < p else 0.0
                    arms[kv].append(record(fps[kv], kv, task, version, sid, 0, 5,
                                           [f"ctx={ctx}", f"depth={depth}"], "ok", s,
                                           completion="The magic number is 4711" if s else "I don't know",
                                           extracted="4711" if s else None))
    write_run(root, stamp, model, task, version, "fp8", 1, 5, arms, fps, {})


def demo_reasoning(root, stamp, model, task, n, repeats, base_p, factor, cutoff):
    version = "1"
    fps = {kv: fp_of(model, kv, task, version) for kv in ("bf16", "fp8")}
    arms = {"bf16": [], "fp8": []}
    for j in range(n):
        sid = f"{task}-{j:03d}"
        p0 = min(0.98, base_p * (0.3 + 1.4 * rng_for("difficulty", task, sid).random()))
        for rep in range(repeats):
            for kv in ("bf16", "fp8"):
                u = rng_for(task, model, sid, rep).random()
                if kv != "bf16" and rng_for("discord", model, sid, rep).random() < 0.15:
                    u = rng_for("own", task, model, sid, rep).random()  # some pairs disagree
                p = p0 * (1.0 if kv == "bf16" else factor)
                s = 1.0 if u < p else 0.0
                finish = "length" if rng_for("cut", model, kv, sid, rep).random() < cutoff else "stop"
                arms[kv].append(record(fps[kv], kv, task, version, sid, rep, 3, [], "ok",
                                       0.0 if finish == "length" else s, finish=finish,
                                       varies=(task == "gpqa_diamond"),
                                       completion="… \\boxed{42}", extracted="42" if s else "17"))
    write_run(root, stamp, model, task, version, "fp8", repeats, 3, arms, fps, {})


def make_demo(root: Path) -> None:
    a, b = "fixture-model-a", "fixture-model-b"
    demo_mrcr(root, "11-00-00", a, 131072, {"fp8": 0.985})
    demo_niah(root, "11-10-00", a, 0.45)
    demo_reasoning(root, "11-20-00", a, "aime25", 30, 4, 0.55, 0.97, 0.03)
    demo_reasoning(root, "11-30-00", a, "gpqa_diamond", 40, 2, 0.6, 1.0, 0.01)
    # model b: a small shift in every bucket, each inside its band, and a skip-layers variant.
    demo_mrcr(root, "12-00-00", b, 262144, {"fp8": 0.93, "fp8_skip2": 0.99})
    demo_reasoning(root, "12-20-00", b, "aime25", 30, 4, 0.45, 0.88, 0.05)
    demo_reasoning(root, "12-30-00", b, "math500", 60, 2, 0.8, 0.99, 0.0)


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="write the report test fixtures")
    ap.add_argument("--demo", type=Path, default=None,
                    help="also write the demo output root here (tests build it in a temp dir)")
    args = ap.parse_args(argv)
    targets = [(HERE / "golden", make_golden)]
    if args.demo is not None:
        targets.append((args.demo, make_demo))
    for root, make in targets:
        if (root / "outputs").exists():
            shutil.rmtree(root / "outputs")
        make(root)
        print(f"wrote {root}")


if __name__ == "__main__":
    main()
