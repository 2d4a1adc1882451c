"""The GPU user's path, as far as a CPU can check it (issue 34): what torch's SDPA is handed by the reference engine
(on CUDA its exact layers take SDPA, and cuDNN's SDPA rejected the reserved cache's V view), engine=auto's choice
for the embedded models, and, where a CUDA GPU is present (the device), the reference engine on CUDA for every arm
kind: BF16, FP8, another format and a skip list."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fp8eval.engines import kvcache  # noqa: E402
from fp8eval.engines.reserved_cache import ReservedLayer  # noqa: E402


def _cache_view(lk: int = 40, d: int = 64):
    """K and V as the reserved cache hands them to attention: views of its buffers, V's with a ones column."""
    layer = ReservedLayer(capacity=lk + 30)
    return layer.update(torch.randn(1, 3, lk, d), torch.randn(1, 3, lk, d))


def test_the_caches_v_is_not_dense_and_sdpa_gets_a_dense_copy_of_the_same_values():
    keys, values = _cache_view()
    assert values.stride(-2) == values.shape[-1] + 1  # the ones column: what cuDNN's SDPA rejected on the H200
    assert not values.is_contiguous()
    k2, v2 = kvcache.sdpa_operands(keys, values)
    assert v2.is_contiguous() and k2.is_contiguous()
    assert torch.equal(v2, values) and torch.equal(k2, keys)
    dense = torch.randn(1, 3, 8, 64)
    assert kvcache.sdpa_operands(dense, dense)[1] is dense  # no copy when there is nothing to fix


@pytest.fixture
def sdpa_spy(monkeypatch):
    """Every exact layer through torch's SDPA, as on CUDA, with each call's operands recorded."""
    monkeypatch.setattr(kvcache, "OWN_EXACT_DEVICES", frozenset())
    calls: list[tuple[bool, bool, bool]] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *a, **kw):
        calls.append((q.is_contiguous() or q.transpose(1, 2).is_contiguous(), k.is_contiguous(), v.is_contiguous()))
        return real(q, k, v, *a, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def _generate(overrides: list[str], arm_index: int):
    pytest.importorskip("transformers")
    from conftest import compose

    from fp8eval.arms import resolve_arms
    from fp8eval.engines import build_engine
    from fp8eval.engines.base import Request

    cfg = compose(["engine=reference", "engine.threads=2", *overrides])
    arms = resolve_arms(cfg)
    req = Request(id="q", messages=({"role": "user", "content": "Name three colours."},), n=1, seeds=(1,),
                  sampling={"temperature": 0.0, "max_tokens": 6})
    try:
        engine = build_engine(cfg, arms[arm_index], {})
    except Exception as e:  # noqa: BLE001 - the embedded model is part of the install; say so if absent
        pytest.skip(f"embedded model unavailable: {e}")
    try:
        return next(iter(engine.generate([req]))).choices[0]
    finally:
        engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("overrides,arm_index", [
    (["kv=bf16", "baseline=none"], 0),  # the arm that died in its first decode step on the H200
    (["kv=fp8", "+kv.engine_args.kv_cache_dtype_skip_layers=[0,1]"], 1),  # FP8 with skipped (exact) layers
])
def test_reference_engine_hands_sdpa_dense_operands_in_prefill_and_decode(sdpa_spy, overrides, arm_index):
    choice = _generate(overrides, arm_index)
    assert choice.error is None and choice.output_tokens > 1  # prefill and at least one decode step
    assert sdpa_spy, "no layer went through SDPA"
    assert all(k and v for _, k, v in sdpa_spy), "SDPA was handed a K or V view that is not dense"


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device)")


@cuda
@pytest.mark.parametrize("overrides,arm_index", [
    (["kv=bf16", "baseline=none"], 0),
    (["kv=fp8"], 0),  # the baseline (BF16) arm of the default pair
    (["kv=fp8"], 1),
    (["kv=fp8", "kv.attention=fa3_fp8"], 1),
    (["kv=int8_per_token_head"], 1),
    (["kv=fp8_per_token_head"], 1),
    (["kv=int4_per_token_head"], 1),
    (["kv=nvfp4"], 1),
    (["kv=turboquant_k8v4"], 1),
    (["kv=fp8_e5m2"], 1),
    (["kv=fp8", "+kv.engine_args.kv_cache_dtype_skip_layers=[0,1]"], 1),
])
def test_reference_engine_on_cuda_generates_every_arm(overrides, arm_index):
    choice = _generate(["engine.device=cuda", *overrides], arm_index)
    assert choice.error is None and choice.output_tokens > 1 and choice.text.strip()


def test_auto_takes_vllm_for_the_embedded_models_on_a_gpu_with_vllm(monkeypatch):
    """On a GPU box with vLLM the default command takes vLLM (FA3), the embedded models included; on a box without
    either it takes the reference engine."""
    import importlib.util

    from conftest import compose

    from fp8eval import engines

    cfg = compose([])
    assert cfg.engine.kind == "auto" and cfg.model.embedded_package
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n == "vllm" else real_find(n, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert engines.resolve_kind(cfg) == "vllm"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert engines.resolve_kind(cfg) == "reference"


# --- start-up: CUDA graphs by workload, arms side by side (fp8eval.engines.vllm.startup) ------------------------


def _vllm_cfg(*overrides):
    from conftest import compose

    return compose(["engine=vllm", *overrides])


def test_cuda_graphs_follow_the_workload_and_an_explicit_setting_wins():
    from fp8eval.engines.vllm.modes import EAGER_MAX_STEPS, graphs_args

    assert graphs_args(_vllm_cfg(), {}) == {"enforce_eager": True}  # the default job: 256 tokens per answer
    assert graphs_args(_vllm_cfg(f"sampling.max_tokens={EAGER_MAX_STEPS + 1}"), {}) == {}  # vLLM's default: compiled
    assert graphs_args(_vllm_cfg("engine.cuda_graphs=on"), {}) == {"enforce_eager": False}
    assert graphs_args(_vllm_cfg(f"sampling.max_tokens={EAGER_MAX_STEPS + 1}", "engine.cuda_graphs=off"), {}) == \
        {"enforce_eager": True}
    assert graphs_args(_vllm_cfg(), {"enforce_eager": False}) == {}
    assert graphs_args(_vllm_cfg(), {"compilation_config": {"level": 3}}) == {}
    from fp8eval.engines.base import EngineError

    with pytest.raises(EngineError, match="auto, on or off"):
        graphs_args(_vllm_cfg("engine.cuda_graphs=sometimes"), {})


def test_both_arms_get_the_same_mode_and_it_is_in_their_engine_args():
    from fp8eval.arms import resolve_arms
    from fp8eval.engines.vllm.args import vllm_engine_args

    cfg = _vllm_cfg("model.embedded_package=null", "model.gguf_file=null")
    modes = {vllm_engine_args(cfg, arm).get("enforce_eager") for arm in resolve_arms(cfg)}
    assert modes == {True}


def _model_dir(tmp_path, weights_gib: float, layers=30, kv_heads=3, head_dim=64, max_len=8192):
    import json

    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": layers, "num_attention_heads": 9,
                                               "num_key_value_heads": kv_heads, "head_dim": head_dim,
                                               "max_position_embeddings": max_len}))
    with open(d / "model.safetensors", "wb") as fh:  # sparse: only its size is read
        fh.truncate(int(weights_gib * (1 << 30)))
    return str(d)


def test_side_by_side_shares_the_gpu_when_the_arms_fit_and_refuses_when_they_do_not(tmp_path):
    from fp8eval.engines.vllm.startup import GIB, MAX_KV_BYTES, kv_bytes_per_token, side_by_side

    h200 = (139 * GIB, 140 * GIB)
    small = _model_dir(tmp_path, 0.3)
    got = side_by_side([{"model": small}, {"model": small, "kv_cache_dtype": "fp8"}], h200)
    assert got and len(got) == 2
    assert got[0]["kv_cache_memory_bytes"] == got[1]["kv_cache_memory_bytes"] == MAX_KV_BYTES
    used = sum(g["gpu_memory_utilization"] for g in got) * h200[1]
    assert used <= h200[0]  # each arm's start-up check passes with the other one started
    assert kv_bytes_per_token({"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                               "head_dim": 64}, "auto") == 30 * 3 * 64 * 2 * 2
    (tmp_path / "b").mkdir()
    big = _model_dir(tmp_path / "b", 61.0, layers=48,
                     kv_heads=4, head_dim=128, max_len=131072)
    assert side_by_side([{"model": big}, {"model": big, "kv_cache_dtype": "fp8"}], h200) is None  # 2 x 61 GB
    assert side_by_side([{"model": small}], h200) is None  # one arm: nothing to share
    assert side_by_side([{"model": small, "kv_cache_memory_bytes": GIB}, {"model": small}], h200) is None  # user's
    assert side_by_side([{"model": small, "tensor_parallel_size": 2}, {"model": small}], h200) is None
    assert side_by_side([{"model": str(tmp_path / "absent")}, {"model": small}], h200) is None
    assert side_by_side([{"model": small}, {"model": small}], (GIB, 140 * GIB)) is None  # a busy GPU


def test_the_door_keeps_prestarted_engines_open_and_hands_the_same_engine_back(monkeypatch):
    from fp8eval import arms as arms_mod
    from fp8eval import engines

    cfg = _vllm_cfg()
    arms = arms_mod.resolve_arms(cfg)
    closed: list[str] = []

    class Stub:
        def __init__(self, name):
            self.name = name

        def close(self):
            closed.append(self.name)

    monkeypatch.setattr(engines, "prestart", lambda cfg, arms, shared, kind=None: {"arms": [a.name for a in arms]})
    monkeypatch.setattr(arms_mod, "build_engine", lambda cfg, arm, shared, kind=None: Stub(arm.name))
    door = arms_mod.open_engines(cfg)
    assert door.prestart(arms) == {"arms": ["bf16", "fp8"]} and door.keep_open
    with door.engine(arms[1]) as first:
        pass
    assert not closed  # kept open for the anatomy
    with door.engine(arms[1]) as again:
        assert again is first
    door.close_all()
    assert closed == ["fp8"]

    monkeypatch.setattr(engines, "prestart", lambda cfg, arms, shared, kind=None: None)
    door = arms_mod.open_engines(cfg)
    assert door.prestart(arms) is None and not door.keep_open
    with door.engine(arms[0]):
        pass
    assert closed == ["fp8", "bf16"]  # one after the other, as before
