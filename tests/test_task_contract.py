"""Every registered task, end to end through the runner on the fake engine, both arms."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO, SHARED_DATA, run_inprocess

from fp8eval.records import read_records
from fp8eval.tasks import REGISTRY, task_class

# What a task needs to run offline in a test (GPQA rows are invented: no GPQA content is ever committed).
OFFLINE = {
    "aime": [f"task.data_files=[{REPO / 'tasks/aime24/aime2024.jsonl'},{REPO / 'tasks/aime25/aime2025_clean.jsonl'}]"],
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
    check_contract(tmp_path, name, REPO / "conf", OFFLINE.get(name, []))


def test_architecture_example_passes_the_contract_as_printed(tmp_path, monkeypatch):
    """docs/ARCHITECTURE.md's worked "add a task" example, taken from the page as printed (module, YAML and
    REGISTRY line), passes the same contract as every registered task."""
    import re
    import sys
    import textwrap
    import types

    import fp8eval.tasks as tasks_pkg

    doc = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")

    def block(lang: str, first_line: str) -> str:
        found = re.search(rf"^( *)```{lang}\n((?:\1.*\n|\n)*?)\1```", doc[doc.index(first_line) - 200:], re.M)
        text = textwrap.dedent(found.group(2))
        assert text.startswith(first_line), text[:80]
        return text

    code = block("python", "# fp8eval/tasks/echo_word.py")
    yaml = block("yaml", "# conf/task/echo_word.yaml")
    name, target = re.search(r'`"(echo_word)": "([\w.:]+)"` in `REGISTRY`', doc).groups()
    module_name = target.partition(":")[0]
    module = types.ModuleType(module_name)
    monkeypatch.setitem(sys.modules, module_name, module)  # before exec: @dataclass looks the module up
    exec(compile(code, f"<{module_name}>", "exec"), module.__dict__)
    monkeypatch.setattr(tasks_pkg, module_name.rpartition(".")[2], module, raising=False)
    monkeypatch.setitem(REGISTRY, name, target)
    conf = tmp_path / "conf"
    (conf / "task").mkdir(parents=True)
    (conf / "task" / f"{name}.yaml").write_text(yaml, encoding="utf-8")
    check_contract(tmp_path, name, conf, [f"hydra.searchpath=[file://{conf}]"])


def check_contract(tmp_path, name: str, conf: Path, extra: list[str]) -> None:
    """One task, both arms on the fake engine with task.limit=2 and 2 repeats: records well formed, limit kept,
    both arms paired key for key, and a second run sends nothing."""
    cls = task_class(name)
    assert isinstance(cls.version, str) and cls.name == name
    assert (conf / "task" / f"{name}.yaml").exists()
    s = run_inprocess(tmp_path, ["engine=fake", "engine.script=echo", f"task={name}", "task.limit=2", "task.repeats=2",
                                 *extra])
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
                                     "task.repeats=2", *extra], "again")
    assert [a["requests_sent"] for a in again["arms"].values()] == [0, 0]
