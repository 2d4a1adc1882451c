"""One lm-eval results file per arm: lm-eval 0.4.13's `results_<date>.json` schema, written from fp8eval's records.

The keys are lm-eval's (`evaluator_utils.EvalResults` plus what `simple_evaluate` and `EvaluationTracker` add):
`results` ({task: {"alias", "<metric>,<filter>", "<metric>_stderr,<filter>"}}), `group_subtasks`, `configs`,
`versions`, `n-shot`, `higher_is_better`, `n-samples` ({task: {original, effective}}), `config` (model,
model_args, batch_size, ..., gen_kwargs, random_seed), `git_hash`, `date`, `model_name`, `model_name_sanitized`,
`system_instruction`, `chat_template`, `total_evaluation_time_seconds`. What lm-eval has no key for (the arm,
its fingerprint, the recovery and verdict) is under `fp8eval`, which lm-eval's readers ignore.

`task=lm_eval`: the metrics are lm-eval's own (every `metric,filter` of the arm summary's `lm_eval` block,
aggregated as lm-eval aggregates them); each mean-aggregated metric gets lm-eval's stderr (sample standard
deviation / sqrt(n)), others "N/A" as lm-eval writes when it has none. Other tasks: `pass@1,none` (the arm's
score and stderr from fp8eval.metrics) and any summary metric that is a single number (MRCR's `auc`), and one
entry per group label (`<task>:<label>`, alias ` - <label>`).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any

SCHEMA_VERSION = "lm-eval 0.4.13"
_EXTRA_METRICS = ("auc", "auc_1m")  # arm-summary numbers that are metrics of the whole task


def _finite(x) -> float | str:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else "N/A"


def _lm_eval_stderrs(records: list[dict], block: dict[str, dict]) -> dict[str, dict[str, float | str]]:
    """lm-eval's mean stderr (sample stdev / sqrt(n)) of each per-document metric in the records' score_details;
    "N/A" with fewer than two values. Only for keys whose aggregate is a plain mean of the values (checked)."""
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.get("status") == "ok":
            for key, v in ((r.get("score_details") or {}).get("metrics") or {}).items():
                if isinstance(v, (int, float)):
                    values[r["sample_id"].rsplit(":", 1)[0]][key].append(float(v))
    out: dict[str, dict[str, float | str]] = {}
    for task, metrics in block.items():
        out[task] = {}
        for key, agg in metrics.items():
            vs = values.get(task, {}).get(key, [])
            is_mean = vs and agg is not None and math.isclose(sum(vs) / len(vs), agg, rel_tol=1e-9, abs_tol=1e-12)
            metric, _, filt = key.partition(",")
            out[task][f"{metric}_stderr,{filt or 'none'}"] = (
                statistics.stdev(vs) / math.sqrt(len(vs)) if is_mean and len(vs) > 1 else "N/A")
    return out


def _group_subtasks(records: list[dict]) -> dict[str, list[str]]:
    """lm-eval's group -> its tasks, from the records' `group=<name>` and `task=<name>` labels (the bridge's)."""
    out: dict[str, set[str]] = defaultdict(set)
    for r in records:
        labels = [g.split("=", 1) for g in r.get("groups") or () if "=" in g]
        tasks = [v for k, v in labels if k == "task"]
        for k, v in labels:
            if k == "group":
                out[v].update(tasks)
    return {g: sorted(ts) for g, ts in sorted(out.items())}


def _task_results(task: str, arm: dict, records: list[dict]) -> tuple[dict, dict]:
    """(results entries, n-samples) of one arm."""
    scored = [r for r in records if r.get("status") == "ok"]
    if task == "lm_eval" and arm.get("lm_eval"):
        block = arm["lm_eval"]
        stderrs = _lm_eval_stderrs(records, block)
        results = {name: {"alias": name, **{k: _finite(v) for k, v in metrics.items()}, **stderrs.get(name, {})}
                   for name, metrics in block.items()}
        docs = defaultdict(set)
        for r in records:
            docs[r["sample_id"].rsplit(":", 1)[0]].add(r["sample_id"])
        done = defaultdict(set)
        for r in scored:
            done[r["sample_id"].rsplit(":", 1)[0]].add(r["sample_id"])
        return results, {n: {"original": len(docs.get(n, ())), "effective": len(done.get(n, ()))} for n in block}
    entry = {"alias": task, "pass@1,none": _finite(arm.get("score")), "pass@1_stderr,none": _finite(arm.get("stderr"))}
    for key in _EXTRA_METRICS:
        if isinstance(arm.get(key), (int, float)):
            entry[f"{key},none"] = _finite(arm[key])
            entry[f"{key}_stderr,none"] = "N/A"
    results = {task: entry}
    for label, score in sorted((arm.get("by_group") or {}).items()):
        results[f"{task}:{label}"] = {"alias": f" - {label}", "pass@1,none": _finite(score),
                                      "pass@1_stderr,none": "N/A"}
    n_samples = {task: {"original": len({r["sample_id"] for r in records}),
                        "effective": len({r["sample_id"] for r in scored})}}
    return results, n_samples


def results_file(cfg, summary: dict, arm_name: str, records: list[dict], task_version: str,
                 n_shot: int | None = None) -> dict:
    """The lm-eval results dict of one arm of a run (`cfg`: the RunConfig; `summary`: its summary.json)."""
    arm = summary["arms"][arm_name]
    task = summary["task"]
    results, n_samples = _task_results(task, arm, records)
    higher = {name: {k.split(",")[0]: True for k in entry if k != "alias" and "_stderr," not in k}
              for name, entry in results.items()}
    hf_id = getattr(cfg.model, "hf_id", None) or cfg.model.name
    sampling = summary.get("sampling") or {}
    model_args = f"pretrained={hf_id},kv_cache_dtype={arm_name}"
    sanitized = re.sub(r"[\"<>:/|\\?*\[\]]+", "__", hf_id)
    verdict = (summary.get("verdict") or {}).get("overall") if arm.get("role") != "baseline" else None
    return {
        "results": results,
        "group_subtasks": _group_subtasks(records) if task == "lm_eval" else {},
        "configs": {name: {"task": name, "tag": [f"fp8eval:{task}"], "generation_kwargs": sampling,
                           "metadata": {"version": task_version}} for name in results},
        "versions": {name: task_version for name in results},
        "n-shot": {name: (n_shot if n_shot is not None else 0) for name in results},
        "higher_is_better": higher,
        "n-samples": n_samples,
        "config": {"model": "fp8eval", "model_args": model_args, "batch_size": None, "batch_sizes": [],
                   "device": None, "use_cache": None, "limit": getattr(cfg.task, "limit", None),
                   "bootstrap_iters": 0, "gen_kwargs": sampling, "random_seed": summary.get("seed"),
                   "numpy_seed": None, "torch_seed": None, "fewshot_seed": getattr(cfg.task, "fewshot_seed", None)},
        "git_hash": None,
        "date": datetime.now(timezone.utc).timestamp(),
        "model_source": "fp8eval",
        "model_name": hf_id,
        "model_name_sanitized": sanitized,
        "system_instruction": getattr(cfg.task, "system_instruction", None),
        "system_instruction_sha": None,
        "fewshot_as_multiturn": False,
        "chat_template": None,
        "chat_template_sha": None,
        "total_evaluation_time_seconds": str(summary.get("wall_s")),
        "fp8eval": {"schema": SCHEMA_VERSION, "arm": arm_name, "role": arm.get("role"),
                    "fingerprint": arm.get("fingerprint"), "baseline": summary.get("baseline"),
                    "recovery": (summary.get("recovery") or {}).get("overall") if verdict else None,
                    "verdict": verdict, "n_skipped": arm.get("n_skipped"), "n_errors": arm.get("n_errors")},
    }


def metric_keys(results: dict) -> list[str]:
    """Every `metric,filter` key of a results dict's `results` (what a reader of lm-eval files looks up)."""
    return sorted({k for entry in results["results"].values() for k in entry if k != "alias"})


def flat_metrics(results: dict) -> dict[str, Any]:
    """`<task>/<metric,filter>` -> value, numbers only (for experiment trackers)."""
    return {f"{name}/{k}": v for name, entry in results["results"].items() for k, v in entry.items()
            if k != "alias" and isinstance(v, float)}
