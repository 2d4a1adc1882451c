"""Results that travel (fp8eval.export): lm-eval results files, records.parquet with prompts, the dataset card,
and the optional W&B / MLflow logging in their offline modes."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from conftest import compose, run_inprocess

from fp8eval.tasks import task_class

sys.path.insert(0, str(Path(__file__).parent))
from test_lm_eval import BASE as LM_EVAL_BASE  # noqa: E402

FAST = ["engine=fake", "task.lengths=[1024,2048]", "task.depths=[0,50,100]", "report=false", "anatomy=false"]
_EVAL_KEYS = {"results", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better", "n-samples", "config",
              "git_hash", "date", "model_name", "model_name_sanitized", "total_evaluation_time_seconds"}


def _run_with(tmp_path: Path, extra: list[str]) -> tuple[dict, list[str]]:
    """A fast NIAH run with `extra` overrides; its summary and every line it printed."""
    from fp8eval.runner import Runner

    lines: list[str] = []
    cfg = compose([f"records_dir={tmp_path / 'records'}", "progress=false", *FAST, *extra])
    return Runner(cfg, tmp_path / "run", out=lines.append).run(), lines


def _lm_eval_file(run_dir: Path, arm: str) -> dict:
    return json.loads((run_dir / "lm_eval" / arm / "results.json").read_text())


def test_lm_eval_task_results_are_lm_evals_own_metrics(tmp_path):
    summary = run_inprocess(tmp_path, LM_EVAL_BASE + ["task.tasks=[fp8eval_toy]", "engine.script=test_lm_eval:oracle",
                                                      "kv=fp8", "+engine.engine_args.fake_fp8_error=0.3"])
    for arm in ("bf16", "fp8"):
        res = _lm_eval_file(tmp_path / "run", arm)
        assert _EVAL_KEYS <= set(res), set(res) ^ _EVAL_KEYS
        blocks = summary["arms"][arm]["lm_eval"]  # the group fp8eval_toy: fp8eval_sums and fp8eval_colours
        assert set(res["results"]) == set(blocks) == {"fp8eval_sums", "fp8eval_colours"}
        for name, block in blocks.items():
            got = res["results"][name]
            assert got["alias"] == name
            assert {k: v for k, v in got.items() if k in block} == {k: v for k, v in block.items() if v is not None}
            for key in block:  # every metric has its stderr key, as lm-eval writes them
                metric, _, filt = key.partition(",")
                assert f"{metric}_stderr,{filt}" in got
        assert sum(n["effective"] for n in res["n-samples"].values()) == summary["arms"][arm]["n_samples"]
        assert res["group_subtasks"] == {"fp8eval_toy": ["fp8eval_colours", "fp8eval_sums"]}
        assert res["fp8eval"]["arm"] == arm and res["fp8eval"]["fingerprint"] == summary["arms"][arm]["fingerprint"]
    assert _lm_eval_file(tmp_path / "run", "fp8")["fp8eval"]["verdict"]["verdict"] == \
        summary["verdict"]["overall"]["verdict"]


def test_lm_eval_reads_the_file(tmp_path):
    """lm-eval's own table maker formats our file (its reader of results_*.json)."""
    pytest.importorskip("lm_eval")
    from lm_eval.utils import make_table

    run_inprocess(tmp_path, FAST)
    table = make_table(_lm_eval_file(tmp_path / "run", "fp8"))
    assert "niah" in table and "pass@1" in table and "ctx=1024" in table


def test_parquet_has_prompts_and_completions_and_an_opt_out(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    summary = run_inprocess(tmp_path, FAST)
    table = pd.read_parquet(tmp_path / "run" / "records.parquet")
    assert set(table["arm"]) == {"bf16", "fp8"}
    assert len(table) == sum(a["n_records"] for a in summary["arms"].values())
    assert table["prompt"].notna().all() and (table["prompt_source"] == "plan").all()
    assert table["completion"].notna().any()
    # The prompt is the task's own, regenerated deterministically: its hash is the record's.
    from fp8eval.core.types import Prompt

    row = table.iloc[0]
    assert Prompt(messages=tuple(json.loads(row["prompt_messages"]))).hash() == row["prompt_hash"]
    assert "needle" in row["prompt"].lower() or len(row["prompt"]) > 500
    private = run_inprocess(tmp_path, FAST + ["export.texts=false"], "private")
    t2 = pd.read_parquet(tmp_path / "private" / "records.parquet")
    assert not {"prompt", "completion", "reasoning", "extracted", "prompt_messages"} & set(t2.columns)
    assert len(t2) == len(table) and t2["score"].tolist() == table["score"].tolist()
    assert private["arms"]["fp8"]["requests_sent"] == 0  # the same records, only exported differently


def test_card_states_the_verdicts(tmp_path):
    summary = run_inprocess(tmp_path, FAST)
    card = (tmp_path / "run" / "README.md").read_text()
    assert card.startswith("---\ntags:\n- fp8eval") and "data_files: records.parquet" in card
    assert f"**{summary['verdict']['overall']['verdict']}**" in card
    assert "ctx=1024" in card and "`lm_eval/fp8/results.json`" in card


def test_exports_can_be_turned_off(tmp_path):
    run_inprocess(tmp_path, FAST + ["export.lm_eval=false", "export.parquet=false", "export.card=false"])
    assert not any((tmp_path / "run" / n).exists() for n in ("lm_eval", "records.parquet", "README.md"))


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed (pip install 'fp8eval[wandb]')")
def test_wandb_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _, lines = _run_with(tmp_path, ["export.wandb=fp8eval-test"])
    assert any(line.startswith("W&B: logged") for line in lines), lines
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert runs and any(p.suffix == ".wandb" for p in runs[0].iterdir())


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow not installed (pip install 'fp8eval[mlflow]')")
def test_mlflow_file_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.x keeps its file store behind this switch
    uri = (tmp_path / "mlruns").as_uri()
    _, lines = _run_with(tmp_path, [f"export.mlflow={uri}"])
    assert any(line.startswith("MLflow: logged") for line in lines), lines
    import mlflow

    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["fp8eval"])
    assert len(runs) == 1 and "metrics.verdict/recovery" in runs.columns


def test_a_missing_tracker_is_one_line_and_the_run_stands(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError, as when not installed
    summary, lines = _run_with(tmp_path, ["export.wandb=x"])
    assert summary["verdict"] and (tmp_path / "run" / "summary.json").is_file()
    assert [line for line in lines if line.startswith("export: W&B not logged: wandb is not installed")], lines
    assert os.path.isfile(tmp_path / "run" / "lm_eval" / "fp8" / "results.json")
    assert task_class("niah").version
