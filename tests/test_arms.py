"""fp8eval.arms, the one door to arms and engines: which arms a run has, and their engines' lifetimes."""

from __future__ import annotations

import pytest
from conftest import compose, run_inprocess

from fp8eval.arms import ArmError, arm_spec, open_engines, resolve_arms, same_setting
from fp8eval.engines import build_engine


def test_baseline_and_variant_composed_the_same_way():
    cfg = compose(["kv=fp8"])
    base, var = resolve_arms(cfg)
    assert (base.name, base.role, var.name, var.role) == ("bf16", "baseline", "fp8", "variant")
    assert var.engine_args["kv_cache_dtype"] == "fp8" and base.engine_args.get("kv_cache_dtype") == "bfloat16"  # asked explicitly (issue 24)
    assert base.engine_args["model"] == var.engine_args["model"] == cfg.model.hf_id  # model < kv < engine
    assert [a.role for a in resolve_arms(compose(["kv=fp8", "baseline=none"]))] == ["single"]


def test_identical_arms_are_one_and_a_control_arm_is_two():
    one = resolve_arms(compose(["kv=bf16"]))
    assert [(a.name, a.role) for a in one] == [("bf16", "baseline")]
    base, control = resolve_arms(compose(["kv=bf16", "++kv.engine_args.enforce_eager=true"]))
    assert (base.name, control.name, control.role) == ("bf16", "bf16-variant", "variant")
    assert control.kv.name == "bf16" and control.engine_args["enforce_eager"] is True
    assert not same_setting(base, control) and same_setting(base, one[0])
    # engine args every arm shares (engine.engine_args) do not make a control arm
    assert len(resolve_arms(compose(["kv=bf16", "++engine.engine_args.enforce_eager=true"]))) == 1


def test_named_arms_and_unknown_names():
    cfg = compose(["kv=fp8"])
    arms = resolve_arms(cfg, ["bf16", "fp8", "fp8_e5m2", "fp8"])
    assert [(a.name, a.role) for a in arms] == [("bf16", "baseline"), ("fp8", "variant"), ("fp8_e5m2", "arm")]
    with pytest.raises(ArmError, match="valid: .*fp8_e5m2"):
        resolve_arms(compose(["kv=fp8", "baseline=bf17"]))


def test_door_shares_one_dict_and_closes_what_is_open():
    cfg = compose(["engine=fake", "kv=fp8"])
    closed = []
    with open_engines(cfg) as door:
        engines = [door.open(a) for a in resolve_arms(cfg)]
        for e in engines:
            e.close = (lambda e=e: closed.append(e.kv.name))
        door.close(engines[0])
        assert closed == ["bf16"]
        with door.engine(arm_spec(cfg, cfg.kv)) as extra:
            extra.close = lambda: closed.append("extra")
        assert closed == ["bf16", "extra"]
    assert closed == ["bf16", "extra", "fp8"]  # the one still open, closed with the door
    with pytest.raises(TypeError, match="arm_spec"):
        build_engine(cfg, cfg.kv, {})


def test_runner_runs_a_control_arm_as_its_own_arm(tmp_path):
    s = run_inprocess(tmp_path, ["engine=fake", "engine.script=echo", "task=niah", "task.lengths=[1024]",
                                 "task.depths=[50]", "task.limit=2", "kv=bf16", "++kv.engine_args.enforce_eager=true"])
    assert list(s["arms"]) == ["bf16", "bf16-variant"] and s["baseline"] == "bf16"
    assert s["arms"]["bf16"]["fingerprint"] != s["arms"]["bf16-variant"]["fingerprint"]
    assert s["recovery"] is not None
    plain = run_inprocess(tmp_path, ["engine=fake", "engine.script=echo", "task=niah", "task.lengths=[1024]",
                                     "task.depths=[50]", "task.limit=2", "kv=bf16"], "plain")
    assert list(plain["arms"]) == ["bf16"] and plain["recovery"] is None
    assert plain["arms"]["bf16"]["fingerprint"] == s["arms"]["bf16"]["fingerprint"]
