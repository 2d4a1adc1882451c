"""What makes a rerun cheap: token counts on disk, memoised data-file hashes, cached reports, and the
engines' prefill counters. Each cache must hit when nothing changed and miss when anything did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, compose, run_inprocess

from fp8eval.core import filehash
from fp8eval.engines.fake import FakeEngine
from fp8eval.engines.vllm import stats as vstats
from fp8eval.token_counts import TokenCountCache

FAST = ["engine=fake", "engine.script=needle", "task.lengths=[1024,2048]", "task.depths=[0,100]"]


@pytest.fixture()
def isolated_cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("FP8EVAL_CACHE", str(root))
    monkeypatch.setattr(filehash, "_memo", None)
    return root


# --- token counts ---------------------------------------------------------------------------------

def test_token_count_cache_round_trip_and_torn_line(tmp_path):
    cache = TokenCountCache(tmp_path, {"tokenizer": "a"})
    assert cache.get("h1") is None
    cache.put("h1", 17)
    cache.put("h1", 17)  # unchanged: not appended again
    with open(cache.path, "a", encoding="utf-8") as f:
        f.write('{"h": "h2", "n"')  # a torn line from a killed process
    again = TokenCountCache(tmp_path, {"tokenizer": "a"})
    assert again.get("h1") == 17 and again.get("h2") is None
    assert len(cache.path.read_text().splitlines()) == 2
    assert TokenCountCache(tmp_path, {"tokenizer": "b"}).get("h1") is None  # another tokenizer, another file
    assert json.loads(cache.path.with_suffix(".key.json").read_text()) == {"tokenizer": "a"}


def test_rerun_plans_from_cached_token_counts(tmp_path, monkeypatch):
    calls = []
    real = FakeEngine.count_prompt_tokens
    monkeypatch.setattr(FakeEngine, "token_count_key", lambda self: {"fake": 1}, raising=False)
    monkeypatch.setattr(FakeEngine, "count_prompt_tokens", lambda self, req: calls.append(1) or real(self, req))
    first = run_inprocess(tmp_path, FAST, "a")
    assert calls and list((tmp_path / "records" / "token_counts").glob("*.jsonl"))
    calls.clear()
    again = run_inprocess(tmp_path, FAST, "b")
    assert calls == []  # planned without the tokenizer
    assert again["arms"]["fp8"]["fingerprint"] == first["arms"]["fp8"]["fingerprint"]
    assert [a["requests_sent"] for a in again["arms"].values()] == [0, 0]
    # Other chat-template kwargs render other prompts: counted afresh.
    run_inprocess(tmp_path, FAST + ["+model.chat_template_kwargs.enable_thinking=false"], "c")
    assert calls


def test_reference_engine_describes_itself_without_torch_or_transformers():
    code = ("import sys; from conftest import compose; from fp8eval.arms import arm_spec; from fp8eval.engines import build_engine;"
            "cfg = compose(['engine=reference', 'engine.device=auto']);"
            "e = build_engine(cfg, arm_spec(cfg, cfg.kv), {}); e.describe(); e.token_count_key();"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    from importlib import metadata

    cpu_build = "+cpu" in metadata.version("torch")
    assert out.stdout.strip() == ("[]" if cpu_build else "['torch']")


# --- data-file hashes ------------------------------------------------------------------------------

def test_file_sha256_memoised_by_stat_and_rehashed_on_change(tmp_path, isolated_cache, monkeypatch):
    big = tmp_path / "big.bin"
    big.write_bytes(b"a" * (filehash.SMALL + 10))
    old = time.time() - 60
    os.utime(big, (old, old))
    hashed = []
    real = filehash._hash
    monkeypatch.setattr(filehash, "_hash", lambda p: hashed.append(p) or real(p))
    first = filehash.file_sha256(big)
    monkeypatch.setattr(filehash, "_memo", None)  # as a new process would: read back from disk
    assert filehash.file_sha256(big) == first and len(hashed) == 1
    big.write_bytes(b"b" * (filehash.SMALL + 10))  # same size, new content, new mtime
    second = filehash.file_sha256(big)
    assert second != first and len(hashed) == 2
    # Just written: not memoised (a same-size rewrite within the clock tick would go unseen).
    assert filehash.file_sha256(big) == second and len(hashed) == 3


# --- reports ---------------------------------------------------------------------------------------

def _fake_run(tmp_path: Path, name: str) -> Path:
    run_dir = tmp_path / name
    summary = run_inprocess(tmp_path, FAST, name)
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    from omegaconf import OmegaConf

    OmegaConf.save(OmegaConf.structured(compose([f"records_dir={tmp_path / 'records'}", "progress=false", *FAST])),
                   run_dir / ".hydra" / "config.yaml")
    assert summary["recovery"] is not None
    return run_dir


def test_unchanged_report_is_copied_with_its_inputs_rewritten(tmp_path, isolated_cache, monkeypatch):
    from fp8eval import report
    from fp8eval.report import build

    first = _fake_run(tmp_path, "first")
    out1 = report.write_report([first])
    again = _fake_run(tmp_path, "again")  # zero-work rerun: same records, another run dir
    monkeypatch.setattr(build, "build_report", lambda *a, **k: pytest.fail("rebuilt an unchanged report"))
    out2 = report.write_report([again])
    md1, md2 = (out1 / "report.md").read_text(), (out2 / "report.md").read_text()
    assert "## Inputs\n\n- `..`" in md2 and str(first) not in md2 and str(tmp_path) not in md2
    assert md2 == md1  # its paths are relative to the report, so the copy fits the new run as it is
    assert (out2 / "recovery.csv").read_bytes() == (out1 / "recovery.csv").read_bytes()
    assert sorted(p.name for p in (out2 / "figures").iterdir()) == sorted(p.name for p in (out1 / "figures").iterdir())


def test_changed_records_or_settings_rebuild_the_report(tmp_path, isolated_cache, monkeypatch):
    from fp8eval import report
    from fp8eval.report import build

    run = _fake_run(tmp_path, "run")
    report.write_report([run])
    builds = []
    real = build.build_report
    monkeypatch.setattr(build, "build_report", lambda *a, **k: builds.append(1) or real(*a, **k))
    report.write_report([run], tmp_path / "other-gate", gate=90.0)
    assert builds == [1]
    records = Path(json.loads((run / "summary.json").read_text())["arms"]["fp8"]["records"])
    lines = records.read_text().splitlines(keepends=True)
    last = json.loads(lines[-1])
    last["score"] = 1.0 - last["score"]
    records.write_text("".join(lines[:-1]) + json.dumps(last) + "\n")
    report.write_report([run])
    assert builds == [1, 1]
    report.write_report([run], cache=False)
    assert len(builds) == 3


def test_cli_rerun_copies_the_report(tmp_path, isolated_cache):
    from conftest import last_path, run_cli

    dirs = [last_path(run_cli(tmp_path, FAST)) for _ in range(2)]
    assert dirs[0] != dirs[1]
    assert all((d / "report" / "index.html").is_file() for d in dirs)
    assert len(list((isolated_cache / "reports").iterdir())) == 1  # the second run's report was a hit
    md = (dirs[1] / "report" / "report.md").read_text()
    assert "## Inputs\n\n- `..`" in md and str(dirs[0]) not in md and str(tmp_path) not in md


# --- engine prefill counters -------------------------------------------------------------------------

def test_prefill_counters_from_prometheus_text():
    text = "\n".join([
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 4075.0',
        'vllm:prompt_tokens_total{engine="1",model_name="m"} 25.0',
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 3072.0',
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 4075.0',
        'vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e9',
    ])
    totals = vstats.metric_totals(text, ("prompt_tokens", "prefix_cache_hits", "prefix_cache_queries"))
    assert totals == {"prompt_tokens": 4100.0, "prefix_cache_hits": 3072.0, "prefix_cache_queries": 4075.0}
    stats = vstats.prefill_stats(totals)
    assert stats["computed_prefill_tokens"] == 1028 and stats["prefix_cache_hit_rate"] == round(3072 / 4100, 6)
    assert vstats.prefill_stats(None) is None and vstats.prefill_stats({"prompt_tokens": 0.0}) is None
