"""Fingerprints of representative configs, pinned: computed at fb61512 (before issue 21's door, hook and
grouped metric) with the same code as below, so a change to how arms are resolved or engines read their args
that moved any existing fingerprint fails here. Runner arms on the fake engine (task niah); divergence arm
material with a stand-in engine description (the real ones name library versions)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import compose

from fp8eval.arms import open_engines, resolve_arms
from fp8eval.divergence.run import arm_fingerprint
from fp8eval.records import fingerprint_hash
from fp8eval.runner import Runner
from fp8eval.sensitivity.cache import fingerprint as sensitivity_fingerprint
from fp8eval.sensitivity.cache import normal_skip, skip_key
from fp8eval.tasks import task_class
from fp8eval.tasks.base import TaskContext

CASES = {
    "fp8": ["kv=fp8"],
    "bf16": ["kv=bf16"],
    "fp8_e5m2": ["kv=fp8_e5m2"],
    "fp8_kv_only": ["kv=fp8", "kv.attention=kv_only"],
    "skip_ints": ["kv=fp8", "++kv.engine_args.kv_cache_dtype_skip_layers=[2,7]"],
    "skip_strs": ["kv=fp8", "++kv.engine_args.kv_cache_dtype_skip_layers=['2','7']"],
    "skip_sw": ["kv=fp8", "++kv.engine_args.kv_cache_dtype_skip_layers=[sliding_window]"],
    "baseline_none": ["kv=fp8", "baseline=none"],
}
PINNED = {
    "divergence/baseline_none/fp8": "92a1e4a3d6beef51a45937010b63696be8e3090093c3b3dc456126e927f8db25",
    "divergence/bf16/bf16": "30afad54553fc3cdc9f04f898b98692d827cebeed40f5926aa4edbedb49849f2",
    "divergence/fp8/bf16": "30afad54553fc3cdc9f04f898b98692d827cebeed40f5926aa4edbedb49849f2",
    "divergence/fp8/fp8": "92a1e4a3d6beef51a45937010b63696be8e3090093c3b3dc456126e927f8db25",
    "divergence/fp8_e5m2/bf16": "30afad54553fc3cdc9f04f898b98692d827cebeed40f5926aa4edbedb49849f2",
    "divergence/fp8_e5m2/fp8_e5m2": "0d3ca74bd089eb04429a261a6e26d5dfad404791ff265ecf37f8a0278c2b3017",
    "divergence/fp8_kv_only/bf16": "30afad54553fc3cdc9f04f898b98692d827cebeed40f5926aa4edbedb49849f2",
    "divergence/fp8_kv_only/fp8": "367e66a8bd2888304de4be8a7cc9cd955639ef2de6f253b21c65efb355bb656d",
    "divergence/skip_ints/bf16": "30afad54553fc3cdc9f04f898b98692d827cebeed40f5926aa4edbedb49849f2",
    "divergence/skip_ints/fp8": "04186ac779c44b7fd484d688064e13e379f01abe70773dcac7154d5aa16e6f51",
    "divergence/skip_strs/bf16": "30afad54553fc3cdc9f04f898b98692d827cebeed40f5926aa4edbedb49849f2",
    "divergence/skip_strs/fp8": "d8a97f547a34766dc834e127f577c998821de39c69a0748388b3b55bcf67e54b",
    "divergence/skip_sw/bf16": "30afad54553fc3cdc9f04f898b98692d827cebeed40f5926aa4edbedb49849f2",
    "divergence/skip_sw/fp8": "8898a803349be6c714fa835001da81b2dbe1aa059abe61ec97625c2ccf5809b4",
    "runner/baseline_none/single:fp8": "ee055e26dd0486f131b77276fb6a9095ef75542d5aa05cc932e7879ebf25330b",
    "runner/bf16/baseline:bf16": "449ad82516c448bb14015e0fbb342e99df655c3036b794ac85851686f6b9eaaa",
    "runner/fp8/baseline:bf16": "449ad82516c448bb14015e0fbb342e99df655c3036b794ac85851686f6b9eaaa",
    "runner/fp8/variant:fp8": "ee055e26dd0486f131b77276fb6a9095ef75542d5aa05cc932e7879ebf25330b",
    "runner/fp8_e5m2/baseline:bf16": "449ad82516c448bb14015e0fbb342e99df655c3036b794ac85851686f6b9eaaa",
    "runner/fp8_e5m2/variant:fp8_e5m2": "f839501faf0f3fa1e8b5ecb3059037fb4fb65ca011dac6ffa9578bb14a93d265",
    "runner/fp8_kv_only/baseline:bf16": "449ad82516c448bb14015e0fbb342e99df655c3036b794ac85851686f6b9eaaa",
    "runner/fp8_kv_only/variant:fp8": "6304c12d636b83118259a6c19f8864f78fcb563eb19793ffc7c78a2aaae60398",
    "runner/skip_ints/baseline:bf16": "449ad82516c448bb14015e0fbb342e99df655c3036b794ac85851686f6b9eaaa",
    "runner/skip_ints/variant:fp8": "e345085fde33ad8730dba6d62f5986c089bc4597a8e53096e88d1734f61afb12",
    "runner/skip_strs/baseline:bf16": "449ad82516c448bb14015e0fbb342e99df655c3036b794ac85851686f6b9eaaa",
    "runner/skip_strs/variant:fp8": "e76393579bb2525df500857d7378be64e45184351805c149618f53ba29f594e7",
    "runner/skip_sw/baseline:bf16": "449ad82516c448bb14015e0fbb342e99df655c3036b794ac85851686f6b9eaaa",
    "runner/skip_sw/variant:fp8": "8b821e05451b47e4c63263648cc80c4a33031b63390ff9f32f3081174ccd85b9"
}


class _Stub:
    def describe(self):
        return {"kind": "stub", "v": 1}


@pytest.mark.parametrize("case", sorted(CASES))
def test_existing_fingerprints_are_unchanged(case):
    cfg = compose(["engine=fake", "task=niah", "task.lengths=[1024]", "task.depths=[50]", "model=smollm2-135m",
                   *CASES[case]])
    runner = Runner(cfg, Path("unused"))
    task = task_class(cfg.task.name)(cfg.task, TaskContext(count_tokens=lambda p: 10, max_model_len=8192,
                                                           model_name=cfg.model.name, seed=cfg.seed, max_tokens=64))
    arms = resolve_arms(cfg)
    with open_engines(cfg) as door:
        for arm in arms:
            with door.engine(arm) as engine:
                got = fingerprint_hash(runner.fingerprint_material(task, engine, arm))
            assert got == PINNED[f"runner/{case}/{arm.role}:{arm.name}"], arm.name
    dcfg = SimpleNamespace(model=cfg.model, divergence=SimpleNamespace(topk=20))
    for arm in arms:
        assert arm_fingerprint(dcfg, _Stub(), arm.kv, "topk")[0] == PINNED[f"divergence/{case}/{arm.name}"]


def test_skip_lists_are_normalised_before_a_sensitivity_run_hashes_them():
    assert normal_skip([7, "2", 2, "sliding_window", " 7"]) == [2, 7, "sliding_window"]
    assert skip_key(["7", 2]) == "2,7" and skip_key([]) == ""
    fps = set()
    for spelling in ("[2,7]", "['7','2']", "[7,2,2]"):
        cfg = compose(["kv=fp8", f"++kv.engine_args.kv_cache_dtype_skip_layers={spelling}"])
        cfg.sensitivity = SimpleNamespace(edges=[0, 256])
        arms = resolve_arms(cfg)
        describe = {"kind": "reference", "kv": {"skip_layers": [str(x) for x in
                                                               cfg.kv.engine_args["kv_cache_dtype_skip_layers"]]}}
        fps.add(sensitivity_fingerprint(cfg, describe, arms[-1].kv, arms[0].kv)[0])
    assert len(fps) == 1
    other = compose(["kv=fp8", "++kv.engine_args.kv_cache_dtype_skip_layers=[2,8]"])
    other.sensitivity = SimpleNamespace(edges=[0, 256])
    arms = resolve_arms(other)
    assert sensitivity_fingerprint(other, {"kind": "reference"}, arms[-1].kv, arms[0].kv)[0] not in fps
