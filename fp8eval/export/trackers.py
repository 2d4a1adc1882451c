"""Optional experiment trackers: W&B (`export.wandb=PROJECT`) and MLflow (`export.mlflow=TRACKING_URI`).

Each logs one run: the config (flattened), every arm's lm-eval metrics (`<arm>/<task>/<metric,filter>`), the
recovery and verdict, and the run dir's export files as artifacts. Both work offline: W&B with
WANDB_MODE=offline (a local `wandb/` folder to `wandb sync` later), MLflow with a `file:` tracking URI. Neither
package is a dependency (extras `fp8eval[wandb]`, `fp8eval[mlflow]`); asked for and missing, the run says so in
one line and its results stand.
"""

from __future__ import annotations

import re
from pathlib import Path


def run_metrics(summary: dict, per_arm: dict[str, dict[str, float]]) -> dict[str, float]:
    """What a tracker logs as metrics: each arm's metrics under `<arm>/`, the recovery, and the verdict's CI."""
    out = {f"{arm}/{k}": v for arm, metrics in per_arm.items() for k, v in metrics.items()}
    overall = (summary.get("verdict") or {}).get("overall") or {}
    for key in ("recovery", "ci_low", "ci_high", "mde_pts"):
        if isinstance(overall.get(key), (int, float)):
            out[f"verdict/{key}"] = float(overall[key])
    return out


def log_wandb(project: str, name: str, config: dict, metrics: dict[str, float], summary: dict,
              files: list[Path], run_dir: Path) -> str:
    """Log to W&B (mode from WANDB_MODE); returns the run's local directory."""
    import wandb

    run = wandb.init(project=project, name=name, config=config, dir=str(run_dir), reinit=True)
    try:
        run.log(metrics)
        run.summary["verdict"] = ((summary.get("verdict") or {}).get("overall") or {}).get("verdict")
        art = wandb.Artifact(f"fp8eval-{name}".replace("/", "-")[:120], type="fp8eval-run")
        for f in files:  # named by their path in the run dir (two arms each have a results.json)
            art.add_file(str(f), name=f.relative_to(run_dir).as_posix())
        run.log_artifact(art)
        return str(run.dir)
    finally:
        run.finish()


def log_mlflow(uri: str, name: str, config: dict, metrics: dict[str, float], summary: dict,
               files: list[Path], run_dir: Path) -> str:
    """Log to MLflow at `uri`; returns the run id."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("fp8eval")
    with mlflow.start_run(run_name=name) as run:
        mlflow.log_params({k: str(v)[:500] for k, v in config.items()})
        # MLflow's names: alphanumerics, _ - . space : / only ("pass@1,none" -> "pass_at_1_none", "ctx=1024" -> "ctx_1024")
        mlflow.log_metrics({re.sub(r"[^\w\-. :/]", "_", k.replace("@", "_at_")): v for k, v in metrics.items()})
        mlflow.set_tag("verdict", str(((summary.get("verdict") or {}).get("overall") or {}).get("verdict")))
        for f in files:  # under their folder in the run dir (two arms each have a results.json)
            folder = f.parent.relative_to(run_dir).as_posix()
            mlflow.log_artifact(str(f), artifact_path=None if folder == "." else folder)
        return run.info.run_id
