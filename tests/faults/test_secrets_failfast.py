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
