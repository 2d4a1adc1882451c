"""Results that travel: what a run writes for the tools people already use (docs/export.md).

`write_all` runs at the end of `python -m fp8eval`, after summary.json: per arm an lm-eval results file
(`lm_eval/<arm>/results.json`), `records.parquet` (every record with its prompt and completion unless
`export.texts=false`), a dataset card (`README.md`, for a Hub push), and, when asked, a W&B or MLflow run.
Nothing here can lose a result: each export that fails is named in one line (and in the returned notes), the
run's summary and records stand.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from fp8eval.core.secrets import redact, redact_obj
from fp8eval.export import card as cards
from fp8eval.export import lm_eval_results, records_table, trackers


def _flat(obj, prefix: str = "") -> dict:
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj}


def after_run(cfg, run_dir: Path, summary: dict, views: dict, items, task, out=print) -> list[str]:
    """The runner's call after summary.json: every export of a whole run (a shard's summary is partial: none);
    `views`: kv name -> the arm's records view; `items`: the run's plan (PlannedItems with their prompts)."""
    if cfg.shard is not None or task is None:
        return []
    plan = {(i.sample.id, i.repeat): (i.prompt_hash, i.prompt) for i in items or ()}
    return write_all(cfg, run_dir, summary, {a: summary_view.records for a, summary_view in views.items()
                                             if a in summary["arms"]}, plan, task.version, out)


def write_all(cfg, run_dir: Path, summary: dict, records: dict[str, list[dict]],
              plan: dict[tuple[str, int], tuple[str, object]], task_version: str, out=print) -> list[str]:
    """Write every export `cfg.export` asks for into `run_dir`; returns one line per export not written.
    `records`: kv name -> the arm's records; `plan`: (sample_id, repeat) -> (prompt hash, Prompt)."""
    ex = cfg.export
    problems: list[str] = []
    files: list[Path] = []
    per_arm: dict[str, dict[str, float]] = {}
    if ex.lm_eval:
        for arm, recs in records.items():
            res = lm_eval_results.results_file(cfg, summary, arm, recs, task_version,
                                               getattr(cfg.task, "num_fewshot", None))
            path = run_dir / "lm_eval" / arm / "results.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(redact_obj(res), indent=2, default=str) + "\n", encoding="utf-8")
            files.append(path)
            per_arm[arm] = lm_eval_results.flat_metrics(res)
    if ex.parquet:
        rows, missing = records_table.rows(records, plan, cfg.model.name, texts=ex.texts)
        try:
            records_table.write(run_dir / "records.parquet", rows)
            files.append(run_dir / "records.parquet")
            if missing:
                out("records.parquet: " + "; ".join(f"{n} row(s) without a prompt ({why})"
                                                    for why, n in sorted(missing.items())))
        except ImportError as e:
            problems.append(f"records.parquet not written: {e.name or 'pyarrow'} is not installed"
                            " (pip install pyarrow, or export.parquet=false)")
    if ex.card:
        names = [f.relative_to(run_dir).as_posix() for f in files] + ["summary.json"]
        (run_dir / "README.md").write_text(redact(cards.card(summary, getattr(cfg.model, "hf_id", None), names)),
                                           encoding="utf-8")
        files.append(run_dir / "README.md")
    if ex.wandb or ex.mlflow:
        metrics = trackers.run_metrics(summary, per_arm)
        config = redact_obj(_flat(cfg))  # no URL credential or token reaches a tracker
        name = run_dir.name
        for which, target, log in (("W&B", ex.wandb, lambda: trackers.log_wandb(
                ex.wandb, name, config, metrics, summary, files, run_dir)),
                                   ("MLflow", ex.mlflow, lambda: trackers.log_mlflow(
                ex.mlflow, name, config, metrics, summary, files, run_dir))):
            if not target:
                continue
            try:
                where = log()
                out(f"{which}: logged {len(metrics)} metrics and {len(files)} files ({where})")
            except ImportError as e:
                problems.append(f"{which} not logged: {e.name} is not installed (pip install 'fp8eval[{e.name}]')")
            except Exception as e:  # a tracker's failure never costs the run its results
                problems.append(f"{which} not logged: {type(e).__name__}: {e}")
    for line in problems:
        out(f"export: {line}")
    return problems
