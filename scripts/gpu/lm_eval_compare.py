"""Issue 17's GPU check, step 2: lm-eval's own model on the documents fp8eval's run scored, and how the two agree.

    python scripts/gpu/lm_eval_compare.py RUN_DIR ARM OUT.json --model vllm --model-args '{"pretrained": DIR, ...}'

Runs lm-eval's simple_evaluate (its own vLLM model class by default) on the same task specs as fp8eval's run
(read from RUN_DIR/.hydra/config.yaml), then compares document by document with fp8eval's records of ARM:
the primary metric of each document, and for scoring requests the largest difference between the two
loglikelihoods of one (context, continuation). tests/test_lm_eval.py runs compare() on CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def task_specs(run_dir: Path) -> tuple[list, str | None, int | None]:
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), resolve=True)
    return cfg["task"]["tasks"], cfg["task"].get("include_path"), cfg["task"].get("limit")


def lm_eval_results(specs: list, include_path: str | None, limit: int | None, model, model_args: dict) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from fp8eval.tasks.lm_eval.bridge import _resolve_paths, _with_overrides

    tm = TaskManager(include_path=include_path)
    tasks = [_with_overrides(tm, _resolve_paths(s)) for s in specs]
    return simple_evaluate(model=model, model_args=model_args or None, tasks=tasks, task_manager=tm, limit=limit,
                           bootstrap_iters=0, log_samples=True)


def compare(summary: dict, arm: str, results: dict) -> dict:
    from fp8eval.engines.base import decode_loglikelihoods
    from fp8eval.records import read_records

    records = {r["sample_id"]: r for r in read_records(Path(summary["arms"][arm]["records"])) if r["repeat"] == 0}
    out: dict = {"tasks": {}}
    for task, samples in results["samples"].items():
        same = differ = missing = 0
        max_ll_diff = 0.0
        for s in samples:
            rec = records.get(f"{task}:{s['doc_id']}")
            if rec is None or rec["status"] != "ok":
                missing += 1
                continue
            key = rec["score_details"]["metric"]
            metric, filt = key.split(",", 1)
            if s["filter"] != filt:
                continue
            same += int(s[metric] == rec["score_details"]["metrics"][key])
            differ += int(s[metric] != rec["score_details"]["metrics"][key])
            if rec["completion"].startswith("[["):
                ours = decode_loglikelihoods(rec["completion"])
                theirs = [r[0] for r in s["resps"]]
                for (a, _), (b, _) in zip(ours, theirs):
                    max_ll_diff = max(max_ll_diff, abs(a - float(b)))
        ours_agg = summary["arms"][arm].get("lm_eval", {}).get(task, {})
        theirs_agg = {k: v for k, v in results["results"][task].items() if k in ours_agg}
        out["tasks"][task] = {"docs_same_metric": same, "docs_different_metric": differ, "docs_missing": missing,
                              "max_loglikelihood_abs_diff": max_ll_diff, "fp8eval": ours_agg, "lm_eval": theirs_agg}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("arm")
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="vllm")
    ap.add_argument("--model-args", default="{}", help="JSON, e.g. the vLLM args of the arm")
    args = ap.parse_args()
    summary = json.loads((args.run_dir / "summary.json").read_text())
    specs, include_path, limit = task_specs(args.run_dir)
    results = lm_eval_results(specs, include_path, limit, args.model, json.loads(args.model_args))
    report = compare(summary, args.arm, results)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
