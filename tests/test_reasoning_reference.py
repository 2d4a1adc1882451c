"""The reasoning tasks end to end with the real embedded model on the reference engine, both arms:
a few problems each, short generations (so length cut-offs are expected and must be counted)."""

from __future__ import annotations

import pytest
from conftest import REPO, SHARED_DATA, run_inprocess

from fp8eval.tasks import task_class

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

TASKS = {
    "aime25": [],
    "math500": [],
    "gpqa_diamond": [f"task.data_files=[{REPO / 'tests/data/gpqa_invented.csv'}]"],
    "livecodebench": [f"task.data_files=[{SHARED_DATA / 'livecodebench/v6_2025-02-01_to_2025-05-01.jsonl'}]"],
}


@pytest.mark.parametrize("task", sorted(TASKS))
def test_reasoning_task_on_the_embedded_model(tmp_path, task):
    if task == "livecodebench" and not SHARED_DATA.is_dir():
        pytest.skip("needs ../shared/data")
    s = run_inprocess(tmp_path, ["engine=reference", f"task={task}", "task.limit=1", "task.repeats=2",
                                 "sampling.max_tokens=24", "sampling.temperature=0.8", *TASKS[task]])
    assert set(s["arms"]) == {"bf16", "fp8"}
    # one request serves both repeats, except where the prompt changes per repeat (GPQA's choice order)
    requests = 2 if task_class(task).prompt_varies_by_repeat else 1
    for arm in s["arms"].values():
        assert arm["engine"] == "reference"
        assert arm["n_samples"] == 1 and arm["n_repeats"] == 2 and arm["requests_sent"] == requests
        assert 0.0 <= arm["score"] <= 1.0 and arm["stderr"] is not None
        assert arm["length_cutoff_rate"] is not None
    assert "overall" in s["recovery"]
