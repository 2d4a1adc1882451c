"""Issue 23, records half: impossible records refused everywhere, repair serialised with writers, heartbeats
with a skewed clock, a streaming reader, group commit."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from conftest import REPO

from fp8eval.core.errors import Fp8evalError
from fp8eval.core.jsonio import write_json
from fp8eval.records import ArmStore, read_arm
from fp8eval.records.__main__ import main as records_main
from fp8eval.records.claims import Claims
from fp8eval.records.schema import RecordError, record_problem
from fp8eval.records.store import REPAIR

FP = "a" * 64
OTHER = "b" * 64


def rec(sid, repeat=0, score=1.0, arm=FP, status="ok", **kw) -> dict:
    out = {"schema": 2, "arm": arm, "task": "t", "sample_id": sid, "repeat": repeat, "status": status,
           "score": score if status == "ok" else None, "prompt_hash": "h", "groups": ["g"],
           "time": "2026-12-01T00:00:00+00:00", "completion": "x" * 10}
    out.update(kw)
    return out


def write_arm(root: Path, lines: list, fp: str = FP, meta: bool = True) -> Path:
    path = root / "t" / f"{fp[:20]}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    if meta:
        path.with_suffix(".arm.json").write_text(json.dumps({"fingerprint": fp, "material": {}}))
    return path


def cli(*args, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "fp8eval.records", *args], env=env, capture_output=True,
                          text=True, timeout=120, **kw)


# --- (a) one validation -------------------------------------------------------------------------
@pytest.mark.parametrize("bad,why", [
    ('{"schema": 2, "arm": "A", "task": "t", "sample_id": "s", "repeat": 0, "status": "ok", "score": NaN}',
     "not finite"),
    ('{"schema": 2, "arm": "A", "task": "t", "sample_id": "s", "repeat": 0, "status": "ok", "score": Infinity}',
     "not finite"),
    (rec("s", score=5.0), "outside the task's score range 0..1"),
    (rec("s", score=-1.0), "outside the task's score range 0..1"),
    (rec("s", schema=99), "schema 99 is not a supported record schema"),
    (rec("s", output_tokens="12"), "output_tokens '12' is not a non-negative integer"),
    (rec("s", prompt_tokens=-3), "prompt_tokens -3 is not a non-negative integer"),
    (rec("s", score=True), "not a number"),
])
def test_impossible_records_are_never_counted_and_check_names_them(tmp_path, bad, why, capsys):
    if isinstance(bad, str):
        bad = bad.replace('"A"', json.dumps(FP))
    good = [rec(f"s{i}", score=float(i % 2)) for i in range(1, 5)]
    path = write_arm(tmp_path, [*good, bad])
    view = read_arm(path, FP, "t")
    assert len(view.records) == 4 and view.ignored == {"not_a_record": 1}
    assert why in str(view.problems[0]) and f"{path}:5:" in str(view.problems[0])
    assert records_main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert why in out and "4 records count" in out


def test_the_writer_refuses_an_impossible_score_with_one_line(tmp_path):
    store = ArmStore(tmp_path, "t", FP, {}).open()
    try:
        for score in (float("nan"), float("inf"), 5.0, -1.0):
            with pytest.raises(RecordError, match=r"refusing to write the record of \('s1', 0\): status ok with score"):
                store.append([rec("s1", score=score)])
        with pytest.raises(RecordError, match="schema 99"):
            store.append([rec("s1", schema=99)])
        store.append([rec("s1", score=1.0)])
    finally:
        store.close()
    assert [r["score"] for r in read_arm(store.path, FP, "t").records] == [1.0]


def test_a_task_declared_range_is_what_counts(tmp_path):
    """score_range None (an lm-eval metric of the user's choosing): any finite number; written in .arm.json
    so check and repair judge the arm the same way."""
    store = ArmStore(tmp_path, "t", FP, {}, score_range=None).open()
    store.append([rec("s1", score=37.5), rec("s2", score=-2.0)])
    store.close()
    assert json.loads(store.meta_path.read_text())["score_range"] is None
    assert len(read_arm(store.path, FP, "t").records) == 2
    assert records_main(["check", str(store.path)]) == 0


def test_summary_json_can_never_hold_nan(tmp_path):
    with pytest.raises(Fp8evalError, match=r"arms.fp8.score is not a finite number"):
        write_json(tmp_path / "summary.json", {"arms": {"fp8": {"score": float("nan")}}})
    assert not (tmp_path / "summary.json").exists()
    write_json(tmp_path / "summary.json", {"x": 1.5})
    json.loads((tmp_path / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(c))


def test_impossible_scores_do_not_move_the_cli_recovery(tmp_path):
    """NaN/inf/5.0/-1.0 and a schema-99 record appended to a finished arm: the rerun's summary is unchanged
    and valid JSON (no NaN), and `check` exits 1."""
    from conftest import run_cli

    args = ["engine=fake", "task.lengths=[1024]", "task.depths=[0,50,100]", "report=false"]
    first = run_cli(tmp_path, args)
    run_dir = tmp_path / first.stdout.strip().splitlines()[-1]
    s1 = json.loads((run_dir / "summary.json").read_text())
    fp8 = Path(s1["arms"]["fp8"]["records"])
    good = json.loads(fp8.read_text().splitlines()[0])
    with open(fp8, "a") as f:
        for change in ({"score": 5.0}, {"score": -1.0}, {"schema": 99, "score": 0.0}):
            f.write(json.dumps({**good, **change, "time": "2099-01-01T00:00:00+00:00"}) + "\n")
        f.write(json.dumps({**good, "time": "2099-01-01T00:00:00+00:00"}).replace(
            f'"score": {json.dumps(good["score"])}', '"score": NaN') + "\n")
    second = run_cli(tmp_path, args)
    s2 = json.loads((tmp_path / second.stdout.strip().splitlines()[-1] / "summary.json").read_text(),
                    parse_constant=lambda c: pytest.fail(f"{c} in summary.json"))
    assert s2["recovery"] == s1["recovery"] and s2["arms"]["fp8"]["score"] == s1["arms"]["fp8"]["score"]
    assert s2["arms"]["fp8"]["n_ignored"] == {"not_a_record": 4}
    got = cli("check", str(fp8))
    assert got.returncode == 1 and got.stdout.count(": not_a_record: ") == 4, got.stdout


# --- (b) repair ------------------------------------------------------------------------------------
def test_repair_without_arm_json_keeps_its_own_and_rejects_the_other_arms(tmp_path):
    path = write_arm(tmp_path, [rec("s1", score=1.0), rec("s1", score=0.0, arm=OTHER, time="2099-01-01T00:00:00"),
                                rec("s2", score=1.0, arm=OTHER), rec("s2", score=0.0)], meta=False)
    assert records_main(["repair", str(path)]) == 0
    kept = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(r["sample_id"], r["arm"], r["score"]) for r in kept] == [("s1", FP, 1.0), ("s2", FP, 0.0)]
    rejected = [json.loads(x) for x in path.with_suffix(".rejected.jsonl").read_text().splitlines()]
    assert {r["arm"] for r in rejected} == {OTHER} and len(rejected) == 2


def test_repair_keeps_a_symlinked_records_file_a_symlink(tmp_path):
    elsewhere = tmp_path / "big_disk" / "arm.jsonl"
    elsewhere.parent.mkdir()
    path = write_arm(tmp_path / "records", [rec("s1"), "garbage", rec("s1"), rec("s2")])
    elsewhere.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(elsewhere)
    assert records_main(["repair", str(path)]) == 0
    assert path.is_symlink() and path.resolve() == elsewhere.resolve()
    assert [json.loads(x)["sample_id"] for x in elsewhere.read_text().splitlines()] == ["s1", "s2"]
    assert not list(elsewhere.parent.glob(".*.tmp"))


def test_a_writer_waits_while_a_repair_holds_the_arm(tmp_path, capsys):
    """The mechanism: a writer that opens the arm while a repair holds `arm.repair` waits (naming the
    repair's host and pid) and appends only once it is released; a repair refuses a live writer."""
    path = write_arm(tmp_path, [rec("s1")])
    repairer = Claims(path.with_suffix(".claims")).register()
    assert repairer.try_claim(REPAIR)
    store = ArmStore(tmp_path, "t", FP, {}, wait_poll_s=0.05)
    opened = threading.Event()
    t = threading.Thread(target=lambda: (store.open(), opened.set()))
    t.start()
    assert not opened.wait(0.5)  # still waiting
    repairer.close()
    assert opened.wait(10)
    t.join()
    err = capsys.readouterr().err
    assert "is being repaired" in err and f"pid {os.getpid()}" in err
    assert "not repaired: writer(s) host" in __import__("fp8eval.records.__main__", fromlist=["x"]).repair(path)
    store.append([rec("s2")])
    store.close()
    assert len(read_arm(path, FP, "t").records) == 2


WRITER = r"""
import sys
from pathlib import Path
from fp8eval.records import ArmStore
root, fp = Path(sys.argv[1]), sys.argv[2]
store = ArmStore(root, "t", fp, {}, wait_poll_s=0.05).open()
store.append([{"schema": 2, "arm": fp, "task": "t", "sample_id": f"new{i}", "repeat": 0, "status": "ok",
               "score": 1.0, "time": "2099-01-01T00:00:00+00:00"} for i in range(10)])
store.close()
"""


def test_a_run_that_starts_while_repair_rewrites_a_large_arm_loses_nothing(tmp_path):
    """The race of issue 23: repair of a ~40 MB arm in one process; a writer starts while it rewrites (its
    claim is there) and appends 10 records. Every one of them is in the arm afterwards."""
    pad = "y" * 1000
    lines = [json.dumps(rec(f"s{i:06d}", completion=pad)) for i in range(40_000)]
    lines += [json.dumps(rec(f"s{i:06d}", completion=pad)) for i in range(0, 40_000, 4)]  # duplicates to drop
    path = write_arm(tmp_path, lines)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    repair = subprocess.Popen([sys.executable, "-m", "fp8eval.records", "repair", str(path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    claim = path.with_suffix(".claims") / REPAIR
    deadline = time.monotonic() + 60
    while not claim.exists() and repair.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    started_during = repair.poll() is None
    writer = subprocess.run([sys.executable, "-c", WRITER, str(tmp_path), FP], env=env, capture_output=True,
                            text=True, timeout=120)
    out, err = repair.communicate(timeout=120)
    assert repair.returncode == 0 and writer.returncode == 0, (out, err, writer.stderr)
    view = read_arm(path, FP, "t")
    assert sum(r["sample_id"].startswith("new") for r in view.records) == 10
    assert len(view.records) == 40_010
    if started_during:
        assert "is being repaired" in writer.stderr


# --- (c) heartbeats -----------------------------------------------------------------------------------
def test_a_claim_dated_in_the_future_is_not_waited_on_forever(tmp_path):
    claims = Claims(tmp_path / "c", stale_s=1.0, max_skew_s=5.0).register()
    other = "farhost-4242-abcdef"
    wfile = claims.writers / f"{other}.json"
    wfile.write_text(json.dumps({"host": "farhost", "pid": 4242, "start": None}))
    future = time.time() + 86400
    os.utime(wfile, (future, future))
    (claims.dir / "k.0").write_text(other)
    assert not claims.try_claim("k.0")  # first sight: maybe alive
    assert claims.describe(other) == "host farhost pid 4242"
    time.sleep(1.2)  # no beat seen for stale_s: taken over, though its file claims to be from tomorrow
    assert claims.try_claim("k.0")
    # within the skew bound a future date is simply fresh
    os.utime(wfile, (time.time() + 3, time.time() + 3))
    assert claims.writer_alive(other)
    claims.close()


# --- (d) streaming ---------------------------------------------------------------------------------
def test_the_reader_does_not_keep_the_file(tmp_path):
    """10,000 records of ~4 KB (~40 MB): `check`'s read (keep=False) and a 10-key selection allocate a
    small fraction of the file (blocks of 1 MB and each key's winner, never the file)."""
    pad = "z" * 4000
    path = write_arm(tmp_path, [json.dumps(rec(f"s{i:06d}", completion=pad)) for i in range(10_000)])
    size = path.stat().st_size
    expected = {(f"s{i:06d}", 0): "h" for i in range(10)}
    tracemalloc.start()
    small = read_arm(path, FP, "t", expected)
    _, peak_small = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    view = read_arm(path, FP, "t", keep=False)
    _, peak_check = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(view.where) == 10_000 and view.n_by_status == {"ok": 10_000} and len(small.records) == 10
    assert small.ignored == {"outside_selection": 9_990}
    assert peak_check < size / 4 and peak_small < size / 8, (peak_check, peak_small, size)


# --- (e) group commit --------------------------------------------------------------------------------
def test_group_commit_acknowledges_only_after_fsync(tmp_path):
    store = ArmStore(tmp_path, "t", FP, {}, commit_s=3600, commit_max=1000).open()
    assert store.claim([("s1", 0), ("s2", 0)]) == [("s1", 0), ("s2", 0)]
    store.append([rec("s1")])
    store.append([rec("s2")])
    other = ArmStore(tmp_path, "t", FP, {}).open()
    assert other.busy_elsewhere([("s1", 0), ("s2", 0)]) == [("s1", 0), ("s2", 0)]  # not acknowledged yet
    assert store.io["fsyncs"] == 0
    assert len(store.read().records) == 2  # reading commits first: what is counted is durable
    assert store.io == {"appends": 2, "fsyncs": 1, "fsync_s": store.io["fsync_s"]}
    assert other.busy_elsewhere([("s1", 0), ("s2", 0)]) == []
    other.close()
    store.close()


def test_a_slow_stream_is_fsynced_at_once(tmp_path):
    """Nothing to group with after a pause of commit_s: the append is acknowledged at once (a slow engine's
    records do not wait for the next completion to become durable)."""
    store = ArmStore(tmp_path, "t", FP, {}, commit_s=0.2).open()
    store.append([rec("s1")])
    assert store.io["fsyncs"] == 0  # right after open: may be grouped with the next
    time.sleep(0.3)
    store.append([rec("s2")])  # 0.3 s later: commits both
    assert store.io["fsyncs"] == 1 and not store._pending
    time.sleep(0.3)
    store.append([rec("s3")])  # after a pause: at once
    assert store.io["fsyncs"] == 2 and not store._pending
    store.close()


KILLED = r"""
import os, signal, sys
from pathlib import Path
from fp8eval.records import ArmStore
store = ArmStore(Path(sys.argv[1]), "t", sys.argv[2], {}, commit_s=3600, commit_max=10**6).open()
store.claim([(f"s{i}", 0) for i in range(5)])
store.append([{"schema": 2, "arm": sys.argv[2], "task": "t", "sample_id": f"s{i}", "repeat": 0, "status": "ok",
               "score": 1.0} for i in range(5)])
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_writer_loses_no_written_line_and_its_claims_are_taken_over(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-c", KILLED, str(tmp_path), FP], env=env, timeout=60)
    store = ArmStore(tmp_path, "t", FP, {}).open()
    assert len(store.read(durable=True).records) == 5
    assert store.claim([(f"s{i}", 0) for i in range(5)]) == [(f"s{i}", 0) for i in range(5)]
    store.close()


def test_an_unacknowledged_record_is_never_counted_by_the_summary(tmp_path):
    """The summary's read is `read(durable=True)`: it commits this writer's appends and fsyncs every file of
    the arm before counting."""
    calls = []
    real = os.fsync
    store = ArmStore(tmp_path, "t", FP, {}, commit_s=3600).open()
    store.append([rec("s1")])
    try:
        os.fsync = lambda fd: (calls.append(fd), real(fd))[1]
        view = store.read(durable=True)
    finally:
        os.fsync = real
    assert len(view.records) == 1 and len(calls) == 2  # this writer's commit, then the arm's file
    store.close()


def test_score_nan_in_float_is_refused_by_the_validator():
    assert "not finite" in record_problem(rec("s", score=math.nan))
