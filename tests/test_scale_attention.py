"""engine.attention_backend (fp8eval.engines.attention) and the report's per-backend view."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
from conftest import compose, run_inprocess

from fp8eval.arms import arm_spec
from fp8eval.engines import attention
from fp8eval.engines.base import EngineError
from fp8eval.records import fingerprint_hash

sys.path.insert(0, str(Path(__file__).parent))


def engine_args(cfg, kv) -> dict:
    """The arm's merged engine args, as every engine reads them (`ArmSpec.engine_args`)."""
    return arm_spec(cfg, kv).engine_args



def test_names_normalise_and_unknown_ones_fail():
    assert attention.validate("flashinfer") == "FLASHINFER"
    assert attention.normalize("Flash Attention") == "FLASH_ATTN"
    assert attention.normalize("AttentionBackendEnum.TRITON_ATTN") == "TRITON_ATTN"
    assert attention.validate(None) is None
    with pytest.raises(EngineError, match="valid: FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLASHMLA"):
        attention.validate("XFORMERZ")


def test_in_engine_args_only_when_set_so_old_fingerprints_stay():
    plain = compose(["engine=vllm", "kv=fp8"])
    chosen = compose(["engine=vllm", "kv=fp8", "engine.attention_backend=flashinfer"])
    assert "attention_backend" not in engine_args(plain, plain.kv)
    assert engine_args(chosen, chosen.kv)["attention_backend"] == "FLASHINFER"
    assert fingerprint_hash(engine_args(plain, plain.kv)) != fingerprint_hash(engine_args(chosen, chosen.kv))


def _fake_python(tmp_path: Path, answer: str) -> str:
    """A stand-in interpreter that answers the EngineArgs probe with `answer`."""
    path = tmp_path / f"python-{answer}"
    path.write_text(f"#!/bin/sh\necho {answer}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_passed_as_engine_arg_or_env_as_the_installed_vllm_expects(tmp_path):
    args = {"model": "m", "attention_backend": "FLASHINFER"}
    new_args, new_env = attention.for_launch(args, {"A": "1"}, _fake_python(tmp_path, "1"))
    assert new_args == args and attention.ENV_VAR not in new_env
    old_args, old_env = attention.for_launch(args, {"A": "1"}, _fake_python(tmp_path, "0"))
    assert "attention_backend" not in old_args and old_env == {"A": "1", "VLLM_ATTENTION_BACKEND": "FLASHINFER"}
    assert args == {"model": "m", "attention_backend": "FLASHINFER"}  # the caller's dict is untouched
    assert attention.for_launch({"model": "m"}, {}, "/nonexistent/python") == ({"model": "m"}, {})


class _Stub:
    def __init__(self, kind, backend=None):
        self._d = {"kind": kind, "preflight": {"attention_backend": backend}}

    def describe(self):
        return self._d


def test_preflight_verifies_the_backend():
    cfg = compose(["engine=vllm", "engine.attention_backend=FLASH_ATTN"])
    assert attention.check(cfg, _Stub("vllm", "FLASH_ATTN")) == {
        "requested": "FLASH_ATTN", "observed": "FLASH_ATTN", "verified": True}
    with pytest.raises(EngineError, match="asked for attention backend FLASH_ATTN but vLLM runs FLASHINFER"):
        attention.check(cfg, _Stub("vllm", "FlashInfer"))
    assert attention.check(cfg, _Stub("server"))["verified"] is False  # external: declared only
    with pytest.raises(EngineError, match="engine=reference has none"):
        attention.check(cfg, _Stub("reference"))
    assert attention.check(compose(["engine=vllm"]), _Stub("vllm")) is None


def test_report_lines_up_recovery_per_backend(tmp_path):
    from fp8eval.report import write_report

    base = ["engine=fake", "task=niah", "task.lengths=[256]", "task.depths=[0,100]", "report=false"]
    dirs = []
    for backend, err in (("FLASH_ATTN", "0.0"), ("FLASHINFER", "0.5")):
        name = f"run-{backend}"
        s = run_inprocess(tmp_path, [*base, f"+engine.engine_args.fake_fp8_error={err}"], name)
        # The fake engine has no kernel; stamp the backend a vLLM run would have recorded.
        s["arms"]["fp8"]["attention_backend"] = {"requested": backend, "observed": backend, "verified": True}
        run_dir = tmp_path / name
        (run_dir / "summary.json").write_text(json.dumps(s))
        (run_dir / ".hydra").mkdir(exist_ok=True)
        cfg = compose([*base, f"+engine.engine_args.fake_fp8_error={err}"])
        from omegaconf import OmegaConf

        OmegaConf.save(OmegaConf.structured(cfg), run_dir / ".hydra" / "config.yaml")
        dirs.append(run_dir)
    out = write_report(dirs, tmp_path / "report")
    md = (Path(out) / "report.md").read_text()
    assert "## Recovery by attention backend" in md
    row = next(line for line in md.splitlines() if line.startswith("| smollm2-135m | niah | bf16 | fp8 |"))
    assert "FLASH_ATTN" in md and "100.0%" in row
    assert (Path(out) / "backends.csv").read_text().count("\n") == 3
