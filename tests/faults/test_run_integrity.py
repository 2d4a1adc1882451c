"""Issue 23, runner half: SIGTERM like SIGINT, every numeric option and path-like name checked, one line and a
non-zero exit for disk errors and odd files, zero scored samples, the table's pair count, sandbox uids."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from fp8eval.bounds import DIVERGENCE_RULES, PERF_RULES, RUN_RULES, check_names, check_numbers
from fp8eval.validate import InputError

FAST = ["engine=fake", "task.lengths=[1024]", "task.depths=[0,50]", "report=false"]


def _one_line_error(proc: subprocess.CompletedProcess, code: int, text: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [x for x in proc.stderr.strip().splitlines() if x.strip()]
    assert text in lines[-1], lines[-3:]


# --- (f) SIGTERM ---------------------------------------------------------------------------------------
def test_sigterm_ends_like_sigint_with_one_line_and_keeps_records(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "fp8eval", "engine=fake", "task.lengths=[1024,2048]",
                             "task.depths=[0,25,50,75,100]", "+engine.engine_args.fake_delay_s=0.3",
                             f"records_dir={tmp_path / 'records'}", "progress=false", "report=false"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
            p.stat().st_size for p in (tmp_path / "records").glob("niah/*.jsonl")):
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("fp8eval: interrupted; finished records are kept, rerun the same "
                                            "command to resume")
    kept = sum(len(p.read_text().splitlines()) for p in (tmp_path / "records").glob("niah/*.jsonl"))
    assert kept >= 1
    assert not list((tmp_path / "records").glob("niah/*.claims/*.*"))  # claims released on the way out


# --- (g) numeric options and names -------------------------------------------------------------------
@pytest.mark.parametrize("rules, cfg, message", [
    (RUN_RULES, {"plan": {"gpus": -2}}, "plan.gpus=-2: must be an integer >= 1 or null"),
    (RUN_RULES, {"plan": {"prefill_tok_s": 0}}, "plan.prefill_tok_s=0: must be a finite number > 0"),
    (RUN_RULES, {"engine": {"concurrency": 0}}, "engine.concurrency=0: must be an integer >= 1"),
    (RUN_RULES, {"engine": {"max_retries": -1}}, "engine.max_retries=-1"),
    (RUN_RULES, {"sampling": {"max_tokens": 0}}, "sampling.max_tokens=0"),
    (RUN_RULES, {"sampling": {"temperature": float("nan")}}, "sampling.temperature=nan"),
    (RUN_RULES, {"scoring_workers": -1}, "scoring_workers=-1"),
    (RUN_RULES, {"model": {"max_model_len": 0}}, "model.max_model_len=0"),
    (DIVERGENCE_RULES, {"divergence": {"lengths": [-5]}}, "divergence.lengths=[-5]: each must be an integer >= 2"),
    (DIVERGENCE_RULES, {"divergence": {"lengths": [0]}}, "divergence.lengths=[0]: each must be an integer >= 2"),
    (DIVERGENCE_RULES, {"divergence": {"lengths": []}}, "divergence.lengths=[]: give a list of at least one"),
    (DIVERGENCE_RULES, {"divergence": {"documents": -1}}, "divergence.documents=-1"),  # 0: the user's texts only
    (DIVERGENCE_RULES, {"divergence": {"batch": 0}}, "divergence.batch=0"),
    (DIVERGENCE_RULES, {"divergence": {"edges": [0, 512, 256]}}, "must be strictly increasing"),
    (PERF_RULES, {"perf": {"throughput_requests": 0}}, "perf.throughput_requests=0"),
    (PERF_RULES, {"perf": {"lengths": [128, -1]}}, "perf.lengths=[128, -1]"),
    (PERF_RULES, {"perf": {"throughput_jitter": 1.5}}, "perf.throughput_jitter=1.5"),
])
def test_numeric_options_are_checked(rules, cfg, message):
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        check_numbers(cfg, rules)


def test_the_shipped_configs_pass_the_checks():
    from conftest import compose

    cfg = compose([])
    check_numbers(cfg, RUN_RULES)
    check_names(cfg)


@pytest.mark.parametrize("args, message", [
    (["plan.gpus=-2", "dry_run=true"], "fp8eval: plan.gpus=-2: must be an integer >= 1 or null"),
    (["model.name=../../X"], "fp8eval: model.name='../../X' cannot name a directory"),
    (["kv.name=a/b"], "fp8eval: kv.name='a/b' cannot name a directory"),
])
def test_cli_refuses_bad_options_with_one_line(tmp_path, args, message):
    proc = run_cli(tmp_path, [*FAST, *args], check=False)
    _one_line_error(proc, 2, message)
    assert not (tmp_path.parent / "X_niah_fp8").exists() and not list(tmp_path.parent.glob("*X_niah*"))
    assert not (tmp_path / "records").exists()


def test_divergence_cli_refuses_lengths_before_any_work(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "fp8eval.divergence", "engine=fake", "divergence.lengths=[-5]",
                           f"records_dir={tmp_path / 'r'}", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    _one_line_error(proc, 2, "divergence.lengths=[-5]: each must be an integer >= 2")


def test_an_experiment_preset_names_the_task_for_the_unknown_key_check(tmp_path):
    from fp8eval.overrides import check_overrides, preset_task

    assert preset_task("seed_mrcr_qwen3_5_27b_1m") == "mrcr"
    check_overrides(["experiment=seed_mrcr_qwen3_5_27b_1m", "task.buckets=[1M]"])  # no SystemExit
    with pytest.raises(SystemExit):
        check_overrides(["experiment=seed_mrcr_qwen3_5_27b_1m", "task.bucketz=[1M]"])
    proc = run_cli(tmp_path, ["experiment=seed_mrcr_qwen3_5_27b_1m", "task.buckets=[1M]", "dry_run=true"])
    assert "dry run: no model loaded" in proc.stdout


# --- (g) one line for disk and file errors ------------------------------------------------------------
INJECT = r"""
import builtins, errno, io, os, runpy, sys
marker, code = sys.argv[1], sys.argv[2]
err = getattr(errno, code)
real_write, real_open, real_mkdir, real_bopen = os.write, os.open, os.mkdir, builtins.open

def _name(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""

def write(fd, data):
    if code == "ENOSPC" and marker in _name(fd) and _name(fd).endswith(".jsonl"):
        raise OSError(err, os.strerror(err))
    return real_write(fd, data)

def _writing(flags):
    return flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)

def open_(path, flags, *a, **k):
    if code == "EROFS" and marker in str(path) and _writing(flags):
        raise OSError(err, os.strerror(err), str(path))
    return real_open(path, flags, *a, **k)

def mkdir(path, *a, **k):
    if code == "EROFS" and marker in str(path) and not os.path.isdir(path):
        raise OSError(err, os.strerror(err), str(path))
    return real_mkdir(path, *a, **k)

def bopen(file, mode="r", *a, **k):
    if code == "EROFS" and marker in str(file) and any(c in mode for c in "wax+"):
        raise OSError(err, os.strerror(err), str(file))
    return real_bopen(file, mode, *a, **k)

os.write, os.open, os.mkdir, builtins.open, io.open = write, open_, mkdir, bopen, bopen
sys.argv = ["fp8eval", *sys.argv[3:]]
runpy.run_module("fp8eval", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("code, text", [
    ("ENOSPC", "No space left on device (ENOSPC); free some space, then rerun the same command"),
    ("EROFS", "Read-only file system (EROFS); choose a writable records_dir"),
])
def test_disk_full_and_read_only_records_are_one_line(tmp_path, code, text):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    records = tmp_path / "records_marker"
    proc = subprocess.run([sys.executable, "-c", INJECT, "records_marker", code, *FAST,
                           f"records_dir={records}", "progress=false"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    _one_line_error(proc, 2, text)


def test_a_file_where_the_records_directory_belongs_is_one_line(tmp_path):
    (tmp_path / "records").write_text("not a directory")
    proc = run_cli(tmp_path, FAST, check=False)
    _one_line_error(proc, 2, "cannot open the records of")


def test_a_directory_where_the_records_file_belongs_is_one_line(tmp_path):
    run_dir = run_cli(tmp_path, FAST).stdout.strip().splitlines()[-1]
    fp8 = Path(json.loads((tmp_path / run_dir / "summary.json").read_text())["arms"]["fp8"]["records"])
    fp8.unlink()
    fp8.mkdir()
    proc = run_cli(tmp_path, FAST, check=False)
    _one_line_error(proc, 2, "move the directory away")


def test_token_counts_that_are_not_counts_are_counted_again(tmp_path):
    from fp8eval.token_counts import TokenCountCache

    cache = TokenCountCache(tmp_path, {"tokenizer": "x"})
    cache.path.parent.mkdir(parents=True)
    cache.path.write_text('{"h": "a", "n": "abc"}\n{"h": "b", "n": -3}\n{"h": "c", "n": true}\n{"h": "d", "n": 7}\n')
    assert [cache.get(h) for h in "abcd"] == [None, None, None, 7]


def test_a_summary_json_that_is_a_list_is_one_line(tmp_path):
    run_dir = tmp_path / run_cli(tmp_path, FAST).stdout.strip().splitlines()[-1]
    (run_dir / "summary.json").write_text("[1, 2]")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "fp8eval.report", str(run_dir)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    _one_line_error(proc, 2, "summary.json: not a run summary (a JSON list)")


def test_an_arm_with_zero_scored_samples_exits_non_zero_with_one_line(tmp_path):
    proc = run_cli(tmp_path, ["engine=fake", "task.lengths=[1024]", "task.depths=[0]", "report=false",
                              "sampling.max_tokens=2000", "model.max_model_len=2048"], check=False)
    _one_line_error(proc, 2, "no scored sample in kv=bf16 (0 errors, 1 skipped of 1 records)")


# --- the terminal table with baseline errors ---------------------------------------------------------
def test_the_table_shows_the_pair_count_and_agrees_with_the_report():
    """bf16 errors on 5 of 10 samples and is right on the other 5; fp8 is right on 6 of 10, 4 of them among
    the 5 pairs: bf16 1.000, fp8 0.600, recovery 80.0 % over 5 pairs (the report's number)."""
    from fp8eval.metrics.arm import arm_summary, paired_recovery
    from fp8eval.table import format_table

    def r(i, status, score):
        return {"sample_id": f"s{i}", "repeat": 0, "status": status, "score": score, "groups": []}

    bf16 = [r(i, "ok", 1.0) if i < 5 else r(i, "error", None) for i in range(10)]
    fp8 = [r(i, "ok", 1.0 if i in (0, 1, 2, 3, 7, 8) else 0.0) for i in range(10)]
    arms = {}
    for name, recs in (("bf16", bf16), ("fp8", fp8)):
        arms[name] = {**arm_summary(recs), "requests_sent": 10}
    summary = {"task": "t", "model": "m", "arms": arms, "recovery": paired_recovery(bf16, fp8)}
    table = format_table(summary)
    overall = next(line for line in table.splitlines() if line.startswith("overall"))
    assert "1.000" in overall and "0.600" in overall and "80.0% (5 pairs)" in overall, table
    assert "recovery is over the 5 (sample, repeat) pairs scored in both arms" in table
    assert summary["recovery"]["overall"] == pytest.approx(80.0) and summary["recovery"]["n_pairs"] == 5


# --- sandbox uids ----------------------------------------------------------------------------------------
def test_two_harness_processes_never_share_a_sandbox_uid(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), FP8EVAL_SANDBOX_UID_LOCKS=str(tmp_path))
    holder = subprocess.Popen([sys.executable, "-c", "from fp8eval.scoring.sandbox.harness import claim_uid\n"
                               "import sys, time\nprint(claim_uid()[0], claim_uid()[0], flush=True)\n"
                               "time.sleep(60)"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        theirs = {int(x) for x in holder.stdout.readline().split()}
        os.environ["FP8EVAL_SANDBOX_UID_LOCKS"] = str(tmp_path)
        from fp8eval.scoring.sandbox.harness import claim_uid

        mine = claim_uid()
        assert len(theirs) == 2 and mine[0] not in theirs
        os.close(mine[1])
    finally:
        os.environ.pop("FP8EVAL_SANDBOX_UID_LOCKS", None)
        holder.kill()
        holder.wait()
    # the kernel drops a dead process's flocks: its uids are free again
    env2 = dict(env)
    got = subprocess.run([sys.executable, "-c", "from fp8eval.scoring.sandbox.harness import claim_uid, ROOT_UID_BASE\n"
                          "print(claim_uid()[0] - ROOT_UID_BASE)"], env=env2, capture_output=True, text=True)
    assert got.stdout.strip() == "0", got.stderr
