"""The runner on the fake engine: pairing, records, resume, fingerprints, config errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, compose, last_path, run_cli, run_inprocess, summary_of

from fp8eval.records import read_records

FAST = ["engine=fake", "task.lengths=[1024,2048]", "task.depths=[0,50,100]"]


def _records(summary: dict, arm: str) -> list[dict]:
    return read_records(Path(summary["arms"][arm]["records"]))


def test_fake_run_pairs_arms_and_writes_contract(tmp_path):
    s = run_inprocess(tmp_path, FAST)
    assert set(s["arms"]) == {"bf16", "fp8"} and s["baseline"] == "bf16"
    for name, arm in s["arms"].items():
        assert arm["score"] == 1.0 and arm["n_samples"] == 6 and arm["n_repeats"] == 1
        assert arm["requests_sent"] == 6
        assert set(arm) >= {"score", "stderr", "n_samples", "n_repeats", "by_group", "records", "fingerprint",
                            "requests_sent"}
        assert set(arm["by_group"]) == {"ctx=1024", "ctx=2048", "depth=0", "depth=50", "depth=100"}
    assert s["arms"]["bf16"]["fingerprint"] != s["arms"]["fp8"]["fingerprint"]
    assert s["recovery"]["overall"] == 100.0 and s["recovery"]["by_group"]["ctx=2048"] == 100.0
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["arms"]["fp8"]["records"] == s["arms"]["fp8"]["records"]
    # byte-identical prompts and identical seeds across the arms
    b, v = _records(s, "bf16"), _records(s, "fp8")
    assert [(r["sample_id"], r["prompt_hash"], r["seed"]) for r in b] == \
           [(r["sample_id"], r["prompt_hash"], r["seed"]) for r in v]


def test_recovery_reflects_a_degraded_arm(tmp_path):
    s = run_inprocess(tmp_path, FAST + ["task.needles_per_cell=4", "+engine.engine_args.fake_fp8_error=0.5"])
    assert s["arms"]["bf16"]["score"] == 1.0
    fp8 = s["arms"]["fp8"]["score"]
    assert 0.2 < fp8 < 0.8
    assert s["recovery"]["overall"] == pytest.approx(100 * fp8)


def test_rerun_sends_zero_requests_and_repeats_extend(tmp_path):
    first = run_inprocess(tmp_path, FAST, "a")
    again = run_inprocess(tmp_path, FAST, "b")
    assert [a["requests_sent"] for a in again["arms"].values()] == [0, 0]
    assert again["arms"]["fp8"]["score"] == first["arms"]["fp8"]["score"]
    # More repeats reuse the first repeat's records: only the new repeat is sent, as one request per sample.
    more = run_inprocess(tmp_path, FAST + ["task.repeats=3"], "c")
    assert more["arms"]["fp8"]["requests_sent"] == 6
    assert more["arms"]["fp8"]["n_repeats"] == 3
    assert len(_records(more, "fp8")) == 18


def test_changing_one_engine_arg_makes_a_new_arm(tmp_path):
    base = run_inprocess(tmp_path, FAST, "a")
    changed = run_inprocess(tmp_path, FAST + ["+kv.engine_args.kv_cache_dtype_skip_layers=[0]"], "b")
    assert changed["arms"]["bf16"]["requests_sent"] == 0  # baseline unchanged, reused
    assert changed["arms"]["fp8"]["requests_sent"] == 6
    assert changed["arms"]["fp8"]["fingerprint"] != base["arms"]["fp8"]["fingerprint"]
    seed = run_inprocess(tmp_path, FAST + ["seed=7"], "c")
    assert all(a["requests_sent"] == 6 for a in seed["arms"].values())
    temp = run_inprocess(tmp_path, FAST + ["sampling.temperature=0.5"], "d")
    assert all(a["requests_sent"] == 6 for a in temp["arms"].values())


def test_prompt_that_does_not_fit_is_skipped_not_truncated(tmp_path):
    s = run_inprocess(tmp_path, FAST + ["model.max_model_len=1500", "task.lengths=[1024,4000]"])
    # 4000 does not fit: the niah grid is capped at the model's context and says so
    assert any("do not fit" in n for n in s["notes"])
    # the runner's own rule: prompt + max_tokens > max_model_len is recorded as skipped
    s2 = run_inprocess(tmp_path, ["engine=fake", "task=aime25", "task.limit=4", "task.repeats=2",
                                  "model.max_model_len=450", "sampling.max_tokens=300"], "b")
    recs = _records(s2, "fp8")
    skipped = [r for r in recs if r["status"] == "skipped"]
    assert skipped and all("never truncated" in r["skip_reason"] for r in skipped)
    assert s2["arms"]["fp8"]["n_skipped"] == len(skipped)
    assert 0 < len(skipped) < 8  # long problems skipped, short ones sent
    again = run_inprocess(tmp_path, ["engine=fake", "task=aime25", "task.limit=4", "task.repeats=2",
                                     "model.max_model_len=450", "sampling.max_tokens=300"], "c")
    assert again["arms"]["fp8"]["requests_sent"] == 0  # skips are final for this fingerprint


def test_length_cutoff_is_counted_apart(tmp_path):
    s = run_inprocess(tmp_path, FAST + ["engine.script=echo", "task.sampling.max_tokens=5"])
    arm = s["arms"]["fp8"]
    assert arm["length_cutoff_rate"] == 1.0 and arm["score"] == 0.0


def test_resume_after_sigkill_loses_nothing_and_duplicates_nothing(tmp_path):
    overrides = FAST + ["task.needles_per_cell=3", "+engine.engine_args.fake_delay_s=0.15", "baseline=none"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "fp8eval", f"records_dir={tmp_path / 'records'}",
                             "progress=false", *overrides], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    records_dir = tmp_path / "records" / "niah"
    deadline = time.time() + 60
    while time.time() < deadline:
        files = list(records_dir.glob("*.jsonl"))
        if files and len(read_records(files[0])) >= 5:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    [path] = list(records_dir.glob("*.jsonl"))
    before = read_records(path)
    assert 5 <= len(before) < 18
    done = run_cli(tmp_path, overrides + ["+engine.engine_args.fake_delay_s=0"] * 0)
    s = summary_of(done)
    arm = s["arms"]["fp8"]
    assert arm["requests_sent"] == 18 - len(before)
    after = read_records(path)
    keys = [(r["sample_id"], r["repeat"]) for r in after]
    assert len(keys) == len(set(keys)) == 18
    assert after[: len(before)] == before  # append-only


def test_torn_last_line_is_repaired(tmp_path):
    s = run_inprocess(tmp_path, FAST + ["baseline=none"], "a")
    path = Path(s["arms"]["fp8"]["records"])
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][:40])  # a write cut by SIGKILL
    s2 = run_inprocess(tmp_path, FAST + ["baseline=none"], "b")
    assert s2["arms"]["fp8"]["requests_sent"] == 1
    assert len(read_records(path)) == 6


def test_cli_prints_run_dir_last_and_table(tmp_path):
    proc = run_cli(tmp_path, FAST + ["report=false"])
    last = proc.stdout.strip().splitlines()[-1]
    assert not Path(last).is_absolute()  # under the working directory: shown relative to it
    assert (last_path(proc) / "summary.json").exists()
    assert "recovery" in proc.stdout and "overall" in proc.stdout


def test_multirun_sweeps_kv(tmp_path):
    run_cli(tmp_path, ["-m", "kv=bf16,fp8", *FAST, "report=false"])
    runs = list((tmp_path / "outputs" / "multirun").glob("*/*/summary.json"))
    assert len(runs) == 2
    by_kv = {json.loads(p.read_text())["task"] + ":" + ",".join(json.loads(p.read_text())["arms"]) for p in runs}
    assert by_kv == {"niah:bf16", "niah:bf16,fp8"}


@pytest.mark.parametrize("args, needle", [
    (["kv=fp9"], "no kv option 'fp9' (did you mean fp8?); options: bf16"),
    (["task.bogus=1"], "Valid keys under task"),
    (["engine.nope=1"], "Valid keys under engine"),
    (["model.sampling.temp=1"], "Valid keys under model.sampling"),
    (["baseline=fp9"], "valid: bf16"),
    # Hermetic whatever the local calibration cache holds: no scales at all, and a model never calibrated.
    (["kv=fp8_per_head", "kv.scales=null"], "needs a scales source"),
    (["kv=fp8_calibrated", "model.name=never-calibrated"], "needs a scales source"),
])
def test_config_errors_are_clear(tmp_path, args, needle):
    engine = [] if "kv=fp8_per_head" in args else ["engine=fake"]
    proc = run_cli(tmp_path, engine + args, check=False)
    assert proc.returncode != 0
    assert needle in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr


def test_qwen3_config_composes_and_fails_clearly_without_weights(tmp_path):
    cfg = compose(["model=qwen3-30b", "kv=fp8"]) if (REPO / "conf/model/qwen3-30b.yaml").exists() else None
    if cfg is None:
        pytest.skip("qwen3-30b model config not present yet")
    assert cfg.kv.engine_args["kv_cache_dtype"] == "fp8"
    proc = run_cli(tmp_path, ["model=qwen3-30b", "kv=fp8", "engine=reference", "task.lengths=[1024]",
                              "task.depths=[50]"], check=False, timeout=600)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_a_larger_grid_reuses_the_smaller_grids_records(tmp_path):
    run_inprocess(tmp_path, ["engine=fake", "task.lengths=[1024]", "task.depths=[0,50]"], "a")
    bigger = run_inprocess(tmp_path, ["engine=fake", "task.lengths=[1024,2048]", "task.depths=[0,50]"], "b")
    assert [a["requests_sent"] for a in bigger["arms"].values()] == [2, 2]
    assert bigger["arms"]["fp8"]["n_samples"] == 4
    other = run_inprocess(tmp_path, ["engine=fake", "task.lengths=[1024]", "task.depths=[0,50]",
                                     "task.distractors=1"], "c")
    assert [a["requests_sent"] for a in other["arms"].values()] == [2, 2]  # prompts differ: new arm


def test_suite_runs_each_task_in_its_own_subdirectory(tmp_path):
    proc = run_cli(tmp_path, ["suite=reasoning", "suite.tasks=[aime25,math500]", "engine=fake",
                              "engine.script='const:The answer is \\boxed{70}.'", "task.limit=2", "task.repeats=2"])
    run_dir = last_path(proc)
    assert "reasoning" in run_dir.name
    suite = json.loads((run_dir / "suite.json").read_text())
    assert suite["suite"] == ["aime25", "math500"]
    aime = json.loads((run_dir / "aime25" / "summary.json").read_text())
    assert aime["task"] == "aime25" and aime["arms"]["fp8"]["n_repeats"] == 2
    assert aime["arms"]["fp8"]["score"] == 0.5  # 70 is the answer to the first 2025 problem only
    assert (run_dir / "math500" / ".hydra" / "config.yaml").exists()
    assert (run_dir / "report" / "recovery.csv").exists()


def vllm_child_seed(request, index: int) -> str:
    """A fake engine script answering with the seed vLLM gives the index-th child of an n-request."""
    return f"seed {request.seeds[0] + index}"


def test_every_repeat_is_sampled_with_the_seed_its_record_states(tmp_path):
    from fp8eval.core.seeds import derive_seed

    overrides = FAST + ["baseline=none", "engine.script=test_runner:vllm_child_seed", "task.repeats=4"]
    first = run_inprocess(tmp_path, overrides, "a")
    path = Path(first["arms"]["fp8"]["records"])
    records = read_records(path)
    assert all(r["completion"] == f"seed {r['seed']}" for r in records)
    assert all(r["seed"] == derive_seed(r["sample_id"], r["repeat"], first["seed"]) for r in records)
    # Lose repeat 1 of every sample: repeats 0, 2, 3 remain, so the rerun must not send repeat 1 inside a
    # request seeded for another repeat.
    kept = [r for r in records if r["repeat"] != 1]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    again = run_inprocess(tmp_path, overrides, "b")
    assert again["arms"]["fp8"]["requests_sent"] == first["arms"]["fp8"]["n_samples"]
    assert all(r["completion"] == f"seed {r['seed']}" for r in read_records(path))
    # Lose repeats 1 and 3: two requests per sample (1 and 3 are not consecutive).
    records = read_records(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in records if r["repeat"] in (0, 2)))
    third = run_inprocess(tmp_path, overrides, "c")
    assert third["arms"]["fp8"]["requests_sent"] == 2 * first["arms"]["fp8"]["n_samples"]
    assert all(r["completion"] == f"seed {r['seed']}" for r in read_records(path))
