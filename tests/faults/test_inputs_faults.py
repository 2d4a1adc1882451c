"""Inputs validated before any work, with the valid range in the message."""

from __future__ import annotations

import pytest
from conftest import run_cli, run_inprocess

from fp8eval.validate import InputError

FAST = ["engine=fake", "task.lengths=[1024]", "task.depths=[0,50]"]


@pytest.mark.parametrize("override, message", [
    ("task.limit=0", "task.limit=0 (niah): must be null (every sample) or an integer >= 1"),
    ("task.limit=-1", "task.limit=-1 (niah): must be null"),
    ("task.repeats=0", "task.repeats=0 (niah): must be an integer >= 1"),
    ("task.depths=[150]", "each must be a percentage in 0..100; not [150.0]"),
    ("task.depths=[]", "give at least one depth in percent (0..100)"),
    ("task.lengths=[0]", "each must be an integer >= 1 (tokens)"),
])
def test_bad_values_are_refused_before_any_work(tmp_path, override, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]").replace(".", r"\.")):
        run_inprocess(tmp_path, [*FAST, override])
    assert not (tmp_path / "records").exists()  # nothing was sent or written


def _aime(tmp_path, text: str, name: str = "data.jsonl"):
    path = tmp_path / name
    path.write_text(text)
    return ["engine=fake", "task=aime25", f"task.data_files=[{path}]", "task.repeats=1", "baseline=none"]


def test_empty_data_file_is_an_error(tmp_path):
    with pytest.raises(InputError, match="no rows"):
        run_inprocess(tmp_path, _aime(tmp_path, "\n"))


def test_malformed_row_names_file_and_line(tmp_path):
    ov = _aime(tmp_path, '{"id": "a", "problem": "1+1", "answer": 2}\n{"id": "b", "problem": \n')
    with pytest.raises(InputError, match=r"data\.jsonl:2: malformed row"):
        run_inprocess(tmp_path, ov)
    ov = _aime(tmp_path, '{"id": "a", "problem": "1+1", "answer": 2}\n[1]\n', "list.jsonl")
    with pytest.raises(InputError, match=r"list\.jsonl:2: malformed row \(a JSON list"):
        run_inprocess(tmp_path, ov)


def test_cli_refuses_unknown_plus_keys_and_bad_values_with_exit_2(tmp_path):
    proc = run_cli(tmp_path, [*FAST, "+foo=1"], check=False)
    assert proc.returncode == 2 and "unknown key 'foo'; valid top-level keys:" in proc.stderr
    proc = run_cli(tmp_path, [*FAST, "+task.depth=[1]"], check=False)
    assert proc.returncode == 2 and "task has no 'depth'" in proc.stderr
    proc = run_cli(tmp_path, [*FAST, "task.limit=0"], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "task.limit=0" in proc.stderr
