"""Records: foreign, duplicate, stale, corrupt and non-record lines; concurrent writers; dead claims."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_inprocess, summary_of

from fp8eval.core.rundir import unique_dir
from fp8eval.records import read_arm, read_records
from fp8eval.records.__main__ import main as records_cli
from fp8eval.records.claims import Claims, claim_name

# 6 samples (2 lengths x 3 depths) x 2 needles, half of the fp8 answers wrong: recovery well below 100 %.
FAST = ["engine=fake", "task.lengths=[1024,2048]", "task.depths=[0,50,100]", "task.needles_per_cell=2",
        "+engine.engine_args.fake_fp8_error=0.5"]


def _paths(s: dict) -> tuple[Path, Path]:
    return Path(s["arms"]["bf16"]["records"]), Path(s["arms"]["fp8"]["records"])


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def test_foreign_record_in_an_arm_file_is_not_counted(tmp_path):
    first = run_inprocess(tmp_path, FAST, "a")
    b, v = _paths(first)
    _append(v, json.dumps(read_records(b)[0]) + "\n")  # a bf16 record in the fp8 file
    again = run_inprocess(tmp_path, FAST, "b")
    assert again["recovery"] == first["recovery"]
    assert again["arms"]["fp8"]["n_ignored"] == {"other_arm": 1}
    assert again["arms"]["fp8"]["requests_sent"] == 0


def test_duplicate_line_counts_once_and_report_agrees(tmp_path):
    from fp8eval.report.load import load_runs

    first = run_inprocess(tmp_path, FAST, "a")
    _, v = _paths(first)
    lines = v.read_text().splitlines(keepends=True)
    _append(v, lines[0] * 3)
    again = run_inprocess(tmp_path, FAST, "b")
    assert again["arms"]["fp8"]["score"] == first["arms"]["fp8"]["score"]
    assert again["arms"]["fp8"]["n_ignored"] == {"superseded": 3}
    # The report reads the arm through the same reader: same records, same score.
    (tmp_path / "b" / ".hydra").mkdir()
    (tmp_path / "b" / ".hydra" / "config.yaml").write_text(
        "model: {name: smollm2-135m}\ntask: {name: niah}\nkv: {name: fp8}\nbaseline: bf16\n")
    _, arms = load_runs([tmp_path / "b"])
    fp8 = next(a for a in arms if a.kv == "fp8")
    scores = [r.data["score"] for r in fp8.records]
    assert sum(scores) / len(scores) == first["arms"]["fp8"]["score"]


def test_stale_prompt_hash_is_resent_and_not_counted(tmp_path):
    first = run_inprocess(tmp_path, FAST, "a")
    _, v = _paths(first)
    recs = read_records(v)
    wrong = dict(recs[0], prompt_hash="0" * 64, score=1.0 - recs[0]["score"], time="9999")
    _append(v, json.dumps(wrong) + "\n")
    again = run_inprocess(tmp_path, FAST, "b")
    assert again["arms"]["fp8"]["score"] == first["arms"]["fp8"]["score"]
    assert again["arms"]["fp8"]["n_ignored"] == {"stale_prompt": 1}


def test_corrupt_and_non_record_lines_are_set_aside_check_and_repair(tmp_path, capsys):
    first = run_inprocess(tmp_path, FAST, "a")
    _, v = _paths(first)
    lines = v.read_text().splitlines(keepends=True)
    v.write_text(lines[0] + "{garbage\n" + '{"just": "json"}\n' + "".join(lines[1:3]) + "[1, 2]\n"
                 + "".join(lines[3:]))
    again = run_inprocess(tmp_path, FAST, "b")  # no JSONDecodeError, no KeyError
    assert again["arms"]["fp8"]["score"] == first["arms"]["fp8"]["score"]
    assert again["arms"]["fp8"]["n_ignored"] == {"corrupt_line": 1, "not_a_record": 2}
    capsys.readouterr()
    assert records_cli(["check", str(v)]) == 1
    out = capsys.readouterr().out
    assert f"{v}:2: corrupt_line" in out and f"{v}:3: not_a_record" in out and f"{v}:6: not_a_record" in out
    assert records_cli(["repair", str(v)]) == 0
    assert records_cli(["check", str(v)]) == 0
    rejected = v.with_suffix(".rejected.jsonl").read_text().splitlines()
    assert rejected == ["{garbage", '{"just": "json"}', "[1, 2]"]
    assert len(read_records(v)) == len(lines)
    final = run_inprocess(tmp_path, FAST, "c")
    assert final["arms"]["fp8"]["score"] == first["arms"]["fp8"]["score"]
    assert final["arms"]["fp8"]["n_ignored"] == {}


def test_error_records_are_retried_and_never_counted_once_good(tmp_path):
    first = run_inprocess(tmp_path, FAST, "a")
    b, v = _paths(first)
    # An earlier invocation that got errors for every pair, written after the good records.
    _append(v, "".join(json.dumps(dict(r, status="error", score=None, time="0000")) + "\n"
                       for r in read_records(v)))
    errs = [dict(r, status="error", score=None) for r in read_records(b)]
    b.write_text("".join(json.dumps(r) + "\n" for r in errs))  # the baseline only has errors
    again = run_inprocess(tmp_path, FAST, "b")
    assert again["arms"]["bf16"]["requests_sent"] == 12 and again["arms"]["fp8"]["requests_sent"] == 0
    assert again["arms"]["bf16"]["n_errors"] == 0 and again["arms"]["fp8"]["n_errors"] == 0
    assert again["recovery"] == first["recovery"]


def _cli(tmp_path: Path, extra: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "fp8eval", *FAST, f"records_dir={tmp_path / 'records'}",
                             "progress=false", "report=false", *extra], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_processes_on_one_arm_never_do_a_pair_twice(tmp_path):
    # kv=fp8 and kv=fp8_e5m2 in parallel share the bf16 baseline; each request takes 50 ms.
    procs = [_cli(tmp_path, ["+engine.engine_args.fake_delay_s=0.05", f"kv={kv}"]) for kv in ("fp8", "fp8_e5m2")]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    # the run dir is printed relative to the command's cwd
    sums = [json.loads((tmp_path / o[0].strip().splitlines()[-1] / "summary.json").read_text()) for o in outs]
    base = Path(sums[0]["arms"]["bf16"]["records"])
    view = read_arm(base, sums[0]["arms"]["bf16"]["fingerprint"], "niah")
    assert len(view.records) == 12 and view.ignored == {}
    lines = sum(len(read_records(p)) for p in [base, *base.with_suffix(".seg").glob("*.jsonl")])
    assert lines == 12  # every (sample, repeat) written once, by one of the two
    assert sum(s["arms"]["bf16"]["requests_sent"] for s in sums) == 12
    assert sums[0]["arms"]["bf16"]["score"] == sums[1]["arms"]["bf16"]["score"] == 1.0


def test_claims_of_a_dead_writer_are_taken_over(tmp_path):
    first = run_inprocess(tmp_path, FAST, "a")
    b, _ = _paths(first)
    keep = read_records(b)[:4]
    b.write_text("".join(json.dumps(r) + "\n" for r in keep))
    # A writer on this host that was SIGKILLed: registered, holding claims on the missing pairs.
    claims_dir = b.with_suffix(".claims")
    dead = Claims(claims_dir)
    dead.writers.mkdir(parents=True, exist_ok=True)
    dead.writer_id = "thishost-999999999-dead"
    (dead.writers / f"{dead.writer_id}.json").write_text(json.dumps(
        {"host": __import__("socket").gethostname(), "pid": 999999999, "start": "1"}))
    for r in read_records(Path(first["arms"]["fp8"]["records"])):
        (claims_dir / claim_name(r["sample_id"], r["repeat"])).write_text(dead.writer_id)
    (claims_dir / "primary.writer").write_text(dead.writer_id)
    again = run_inprocess(tmp_path, FAST, "b")
    assert again["arms"]["bf16"]["requests_sent"] == 8 and again["recovery"] == first["recovery"]


def test_claims_are_exclusive_between_live_writers(tmp_path):
    a, b = Claims(tmp_path / "c").register(), Claims(tmp_path / "c").register()
    try:
        assert a.try_claim("x.0") and not b.try_claim("x.0")
        a.release(["x.0"])
        assert b.try_claim("x.0")
    finally:
        a.close()
        b.close()


def test_torn_tail_is_set_aside_then_cut_by_its_writer(tmp_path):
    first = run_inprocess(tmp_path, FAST, "a")
    _, v = _paths(first)
    _append(v, '{"schema": 2, "arm": "')  # killed mid-write
    again = run_inprocess(tmp_path, FAST, "b")
    assert again["arms"]["fp8"]["score"] == first["arms"]["fp8"]["score"]
    assert v.read_text().endswith("}\n")  # the primary writer cut it on open


def test_run_directories_never_collide(tmp_path, monkeypatch):
    from fp8eval.core import rundir

    monkeypatch.setattr(rundir, "_CHOSEN", {})
    first = unique_dir(str(tmp_path / "runs" / "same-second"))
    assert unique_dir(str(tmp_path / "runs" / "same-second")) == first  # memoised: Hydra asks twice
    monkeypatch.setattr(rundir, "_CHOSEN", {})  # another process
    second = unique_dir(str(tmp_path / "runs" / "same-second"))
    assert second == first + "-2" and Path(second).is_dir()


@pytest.mark.parametrize("bad", ["{not json\n", "[]\n"])
def test_check_names_file_and_line(tmp_path, bad, capsys):
    run_inprocess(tmp_path, FAST, "a")
    root = tmp_path / "records"
    arm = sorted(root.glob("niah/*.jsonl"))[0]
    _append(arm, bad)
    n = len(arm.read_text().splitlines())
    assert records_cli(["check", str(root)]) == 1
    assert f"{arm}:{n}:" in capsys.readouterr().out


def test_cli_summary_counts_ignored(tmp_path):
    from conftest import run_cli

    proc = run_cli(tmp_path, [*FAST, "report=false"])
    s = summary_of(proc)
    assert s["arms"]["fp8"]["n_ignored"] == {}


def test_armstore_api_for_concurrent_writers(tmp_path):
    """The API shards use: two writers of one arm, the second in its own segment; claims exclusive."""
    from fp8eval.records import ArmStore

    def rec(sid: str, repeat: int, score: float) -> dict:
        return {"schema": 2, "arm": "f" * 64, "task": "t", "sample_id": sid, "repeat": repeat, "status": "ok",
                "score": score, "prompt_hash": "h", "time": "2026"}

    a = ArmStore(tmp_path, "t", "f" * 64, {}).open()
    b = ArmStore(tmp_path, "t", "f" * 64, {}).open()
    try:
        assert a.own_path == a.path and b.own_path.parent.name.endswith(".seg")
        assert a.claim([("s1", 0), ("s2", 0)]) == [("s1", 0), ("s2", 0)]
        assert b.claim([("s1", 0), ("s3", 0)]) == [("s3", 0)]
        assert b.busy_elsewhere([("s1", 0), ("s2", 0)]) == [("s1", 0), ("s2", 0)]
        a.append([rec("s1", 0, 1.0), rec("s2", 0, 0.0)])
        a.release([("s1", 0), ("s2", 0)])
        b.append([rec("s3", 0, 1.0)])
        b.release([("s3", 0)])
        expected = {("s1", 0): "h", ("s2", 0): "h", ("s3", 0): "h"}
        view = b.read(expected)
        assert [r["sample_id"] for r in view.records] == ["s1", "s2", "s3"] and view.ignored == {}
        assert b.claim([("s1", 0)]) == [("s1", 0)]  # released by a: free again (b re-reads: done)
    finally:
        a.close()
        b.close()
    assert not list(a.claims_dir.glob("*.*"))  # every claim released
