"""Every registered task, end to end through the runner on the fake engine, both arms."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO, SHARED_DATA, run_inprocess

from fp8eval.records import read_records
from fp8eval.tasks import REGISTRY, task_class

# What a task needs to run offline in a test (GPQA rows are invented: no GPQA content is ever committed).
OFFLINE = {
    "gpqa_diamond": [f"task.data_files=[{REPO / 'tests/data/gpqa_invented.csv'}]"],
    "livecodebench": [f"task.data_files=[{SHARED_DATA / 'livecodebench/v6_2025-02-01_to_2025-05-01.jsonl'}]"],
    "lm_eval": [f"task.include_path={REPO / 'tests/data/lm_eval'}", "task.tasks=[fp8eval_colours]",
                "task.offline=true"],
    "mrcr": ["task.synthetic=true"],
    "niah": ["task.lengths=[1024]", "task.depths=[0,100]"],
    "niah_128k": ["task.lengths=[1024]", "task.depths=[0,100]"],
}
NEEDS_SHARED = {"livecodebench"}


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_task_contract(tmp_path, name):
    if name in NEEDS_SHARED and not SHARED_DATA.is_dir():
        pytest.skip("needs ../shared/data")
    cls = task_class(name)
    assert isinstance(cls.version, str) and cls.name == name
    assert (REPO / "conf" / "task" / f"{name}.yaml").exists()
    s = run_inprocess(tmp_path, ["engine=fake", "engine.script=echo", f"task={name}", "task.limit=2", "task.repeats=2",
                                 *OFFLINE.get(name, [])])
    assert s["task"] == name and set(s["arms"]) == {"bf16", "fp8"}
    recs = {k: read_records(Path(a["records"])) for k, a in s["arms"].items()}
    for arm, rs in recs.items():
        assert rs, arm
        for r in rs:
            assert r["task"] == name and r["task_version"] == cls.version
            assert all(isinstance(g, str) for g in r["groups"])
            if r["status"] == "ok":
                assert 0.0 <= r["score"] <= 1.0
        a = s["arms"][arm]
        assert a["n_repeats"] in (0, 2) and a["n_samples"] <= 2
    key = lambda r: (r["sample_id"], r["repeat"], r["prompt_hash"], r["seed"])  # noqa: E731
    assert sorted(map(key, recs["bf16"])) == sorted(map(key, recs["fp8"]))
    again = run_inprocess(tmp_path, ["engine=fake", "engine.script=echo", f"task={name}", "task.limit=2",
                                     "task.repeats=2", *OFFLINE.get(name, [])], "again")
    assert [a["requests_sent"] for a in again["arms"].values()] == [0, 0]
