"""Credentials are redacted everywhere we write or print; a model that cannot run here fails fast."""

from __future__ import annotations

import os
import time

from conftest import run_cli

from fp8eval.core.secrets import redact


def test_redact():
    assert redact("http://user:pass@host:8000/v1") == "http://***@host:8000/v1"
    assert redact("see https://tok@h/x?api_key=abc&x=1") == "see https://***@h/x?api_key=***&x=1"
    assert redact("http://host:8000/v1") == "http://host:8000/v1"


def test_url_credentials_never_reach_hydra_files_or_stderr(tmp_path):
    url = "http://alice:hunter2@127.0.0.1:9"  # nothing listens on port 9
    proc = run_cli(tmp_path, ["engine=server", f"engine.base_url={url}", "engine.max_retries=0",
                              "report=false", "hydra.run.dir=run"], check=False)
    assert proc.returncode == 2
    assert "hunter2" not in proc.stderr + proc.stdout and "http://***@127.0.0.1:9" in proc.stderr
    files = list((tmp_path / "run" / ".hydra").glob("*.yaml"))
    assert len(files) == 3
    for f in files:
        assert "hunter2" not in f.read_text() and "alice" not in f.read_text(), f
    assert "http://***@127.0.0.1:9" in (tmp_path / "run" / ".hydra" / "config.yaml").read_text()


def test_hub_model_without_gpu_fails_fast_naming_the_engines(tmp_path):
    t0 = time.monotonic()
    proc = run_cli(tmp_path, ["model=qwen3-30b", "report=false"], check=False)
    took = time.monotonic() - t0
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "engine=vllm" in proc.stderr and "engine=server" in proc.stderr
    assert took < 15, took  # ~1.6 s on an idle 2-core machine; the bound leaves room for a loaded CI box


def test_unreachable_hub_is_detected_once_quickly(monkeypatch):
    from fp8eval.core import hub

    for var in hub.OFFLINE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hub, "_STATE", {})
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    t0 = time.monotonic()
    assert "no connection to 127.0.0.1:9" in hub.prepare_offline()
    assert time.monotonic() - t0 < 2.0
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # the hub libraries now fail (or load the cache) at once
    monkeypatch.setattr(hub, "_STATE", {})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.offline_reason() == "HF_HUB_OFFLINE=1"


# --- one redaction for everything written or printed (fp8eval.core.secrets) -------------------------------
SECRETS = ("hunter2", "alice", "SIGSECRET", "AUTHSECRET", "HDRSECRET", "KEYSECRET", "TOKSECRET")


def assert_no_secret(root, *texts):
    """No secret in any file under `root` (every file, whatever its kind) nor in `texts` (stdout, stderr)."""
    from pathlib import Path

    files = [p for p in Path(root).rglob("*") if p.is_file()]
    assert files
    for path in files:
        data = path.read_bytes()
        for s in SECRETS:
            assert s.encode() not in data, (path, s)
    for text in texts:
        for s in SECRETS:
            assert s not in text, (s, text[-2000:])
    return files


def test_redact_every_form():
    cases = {
        r"engine.base_url=http\://alice\:hunter2@127.0.0.1\:9/v1": r"engine.base_url=http\://***@127.0.0.1\:9/v1",
        "http://h/v1?x=1&sig=SIGSECRET&Auth=AUTHSECRET#f": "http://h/v1?x=1&sig=***&Auth=***#f",
        "https://b.blob/x?sv=1&se=2&signature=abc%2F&X-Amz-Signature=ff": "https://b.blob/x?sv=1&se=2&signature=***&X-Amz-Signature=***",
        "http://h/?token=t&access_token=u&api_key=v&key=w": "http://h/?token=***&access_token=***&api_key=***&key=***",
        "Authorization: Bearer sk-TOKSECRET": "Authorization: ***",
        r"++engine.default_headers.Authorization=Bearer\ HDRSECRET,x=1": "++engine.default_headers.Authorization=***,x=1",
        '{"X-Api-Key": "KEYSECRET", "X-Team": "eval"}': '{"X-Api-Key": "***", "X-Team": "eval"}',
        r'"url": "http:\/\/alice:hunter2@h"': r'"url": "http:\/\/***@h"',
        # left alone: no secret there
        "api_key_env: OPENAI_API_KEY": "api_key_env: OPENAI_API_KEY",
        "max_tokens: 16, monkey=1": "max_tokens: 16, monkey=1",
        "http://127.0.0.1:8000/v1 and me@example.com": "http://127.0.0.1:8000/v1 and me@example.com",
    }
    for text, want in cases.items():
        assert redact(text) == want, text
        assert redact(want) == want  # idempotent


def test_a_multirun_sweep_writes_and_prints_no_secret(tmp_path):
    """`-m` sweep: multirun.yaml, each job's .hydra/{hydra,config,overrides}.yaml (Hydra writes `:` as
    `\\:` there), summary.json, stdout and stderr carry no credential of the URL or the headers."""
    url = "'http://alice:hunter2@127.0.0.1:9/v1?sig=SIGSECRET&auth=AUTHSECRET'"
    proc = run_cli(tmp_path, ["-m", "engine=fake", f"engine.base_url={url}",
                              "engine.default_headers.Authorization=Bearer HDRSECRET",
                              "engine.default_headers.X-Api-Key=KEYSECRET", "seed=1,2", "baseline=none", "kv=bf16",
                              "task.lengths=[512]", "task.depths=[0]", "task.needles_per_cell=1", "report=false"])
    files = assert_no_secret(tmp_path / "outputs" / "multirun", proc.stdout, proc.stderr)
    names = {p.name for p in files}
    assert {"multirun.yaml", "hydra.yaml", "overrides.yaml", "config.yaml", "summary.json"} <= names
    [multirun] = [p for p in files if p.name == "multirun.yaml"]
    assert "http://***@127.0.0.1:9/v1?sig=***&auth=***" in multirun.read_text()
    overrides = next(p for p in files if p.name == "overrides.yaml").read_text()
    assert r"http\://***@127.0.0.1\:9" in overrides or "http://***@127.0.0.1:9" in overrides


def _pool_cli(tmp_path, urls, *extra):
    import json as _json

    proc = run_cli(tmp_path, ["engine=server", f"engine.base_urls.bf16=[{','.join(urls)}]", "kv=bf16",
                              "baseline=none", "task.lengths=[512]", "task.depths=[0,100]", "task.needles_per_cell=1",
                              "engine.max_retries=1", "engine.eject_after=1", "report=false",
                              "hydra.run.dir=run", *extra], check=False)
    summary = tmp_path / "run" / "summary.json"
    return proc, (_json.loads(summary.read_text()) if summary.is_file() else None)


def test_a_replica_failing_its_start_up_check_prints_no_secret(tmp_path):
    from fake_openai_server import FakeOpenAIServer

    model = "HuggingFaceTB/SmolLM2-135M-Instruct"
    with FakeOpenAIServer(model=model) as good, FakeOpenAIServer(model="another/model") as odd:
        urls = [u.replace("http://", "http://alice:hunter2@") for u in (good.url, odd.url)]
        proc, summary = _pool_cli(tmp_path, urls)
    assert proc.returncode == 2 and summary is None
    assert "failed its preflight" in proc.stderr and "http://***@127.0.0.1" in proc.stderr
    assert_no_secret(tmp_path / "run", proc.stdout, proc.stderr)


def test_a_pool_dropping_a_replica_writes_no_secret_in_summary(tmp_path):
    from fake_openai_server import FakeOpenAIServer

    model = "HuggingFaceTB/SmolLM2-135M-Instruct"
    with FakeOpenAIServer(model=model) as bad, FakeOpenAIServer(model=model) as good:
        bad.fault_fn = lambda body, attempt: "cut"
        urls = [u.replace("http://", "http://alice:hunter2@") for u in (bad.url, good.url)]
        proc, summary = _pool_cli(tmp_path, urls, "engine.concurrency=1")
    assert proc.returncode == 0, proc.stderr
    arm = summary["arms"]["bf16"]
    assert arm["replica_pool"]["ejected"] == 1 and arm["n_errors"] == 0
    assert "http://***@127.0.0.1" in arm["engine_warnings"]["replica_dropped"][0]
    assert_no_secret(tmp_path / "run", proc.stdout, proc.stderr)


def test_perf_prints_and_writes_no_secret(tmp_path):
    """perf's "server ready at ..." line, perf.json and its .hydra/ files."""
    import subprocess
    import sys

    from conftest import REPO

    from fp8eval.perf.fake_server import FakeServer, FakeSettings, LatencyLaw

    with FakeServer(FakeSettings(model="m", max_model_len=4096, law=LatencyLaw(itl_a_ms=1.0))) as a:
        url = a.url.replace("http://", "http://alice:hunter2@")
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.run(
            [sys.executable, "-m", "fp8eval.perf", "kv=bf16", "engine.served_model_name=m",
             f"engine.base_urls.bf16={url}", "perf.client=builtin", "perf.lengths=[256,512]",
             "perf.sweep_requests=1", "perf.sweep_output_tokens=4", "perf.warmup_requests=0", "perf.throughput=false",
             "perf.measure_client_overhead=false", "perf.plots=false", "hydra.run.dir=run"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "server ready at http://***@127.0.0.1" in proc.stdout + proc.stderr
    files = assert_no_secret(tmp_path / "run", proc.stdout, proc.stderr)
    assert {"perf.json", "config.yaml", "hydra.yaml", "overrides.yaml"} <= {p.name for p in files}


def test_divergence_hydra_files_carry_no_secret(tmp_path):
    """The divergence CLI saves .hydra/ like every Hydra app; its callback redacts them before the job runs
    (here the job stops at once: an unknown baseline)."""
    import subprocess
    import sys

    from conftest import REPO

    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "fp8eval.divergence", "engine=server", "engine.base_url=http://alice:hunter2@127.0.0.1:9",
         "++engine.default_headers.X-Api-Key=KEYSECRET", "baseline=nope", "hydra.run.dir=run"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "baseline='nope' is not a kv option" in proc.stderr
    files = assert_no_secret(tmp_path / "run", proc.stdout, proc.stderr)
    assert {"config.yaml", "hydra.yaml", "overrides.yaml"} <= {p.name for p in files}
    assert "http://***@127.0.0.1:9" in (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
