"""The reference engine with the real embedded model: the emulated FP8 cache is really applied
(prefill included), while the BF16 cache stays close to full precision."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import compose  # noqa: E402

from fp8eval.engines.base import Request  # noqa: E402
from fp8eval.engines.kvcache import KVPolicy  # noqa: E402
from fp8eval.engines.reference import ReferenceEngine  # noqa: E402
from fp8eval.tasks.niah.haystack import haystack_text  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    try:
        cfg = compose(["kv=fp8", "engine.threads=2"])
        eng = ReferenceEngine(cfg, cfg.kv, shared={})
        eng._load()
    except Exception as e:  # the embedded model package is part of the install; say so if it is missing
        pytest.skip(f"embedded model unavailable: {e}")
    return eng


def _logits(engine, policy: KVPolicy, ids: torch.Tensor) -> torch.Tensor:
    engine._shared["active_policy"] = policy
    with torch.inference_mode():
        return engine._model(input_ids=ids).logits[0].float()


@pytest.fixture(scope="module")
def prompt_ids(engine):
    text = haystack_text(1500)
    req = Request(id="t", messages=({"role": "user", "content": f"Summarise:\n{text}"},), n=1, seeds=(0,),
                  sampling={})
    return torch.tensor([engine.prompt_ids(req)])


def test_fp8_cache_changes_prefill_logits_bf16_stays_close(engine, prompt_ids):
    full = _logits(engine, KVPolicy(cache_dtype="auto", model_dtype=torch.float32), prompt_ids)
    bf16 = _logits(engine, KVPolicy(cache_dtype="auto", model_dtype=torch.bfloat16), prompt_ids)
    fp8 = _logits(engine, KVPolicy(cache_dtype="fp8"), prompt_ids)
    e5m2 = _logits(engine, KVPolicy(cache_dtype="fp8_e5m2"), prompt_ids)
    d_bf16 = (bf16 - full).abs().mean().item()
    d_fp8 = (fp8 - full).abs().mean().item()
    d_e5m2 = (e5m2 - full).abs().mean().item()
    # A single forward pass is all prefill: a cache that left the prefill in full precision would give 0.
    assert d_fp8 > 0 and d_e5m2 > 0
    assert d_fp8 > 3 * d_bf16, (d_fp8, d_bf16)
    assert d_e5m2 > d_fp8  # two mantissa bits lose more than three
    # BF16 keeps the model's choices: next-token argmax agrees almost everywhere with full precision.
    agree = (bf16.argmax(-1) == full.argmax(-1)).float().mean().item()
    assert agree > 0.97, agree
    assert d_bf16 < 0.05 * full.std().item()


def test_skipping_every_layer_is_exactly_the_bf16_cache(engine, prompt_ids):
    n = engine._model.config.num_hidden_layers
    bf16 = _logits(engine, KVPolicy(cache_dtype="auto"), prompt_ids)
    skipped = _logits(engine, KVPolicy(cache_dtype="fp8", skip_layers=tuple(str(i) for i in range(n))), prompt_ids)
    some = _logits(engine, KVPolicy(cache_dtype="fp8", skip_layers=("0", "1")), prompt_ids)
    fp8 = _logits(engine, KVPolicy(cache_dtype="fp8"), prompt_ids)
    assert torch.equal(skipped, bf16)
    assert not torch.equal(some, fp8) and not torch.equal(some, bf16)


def test_per_head_scales_and_fp8_attention_path_change_results(engine, prompt_ids):
    n = engine._model.config.num_hidden_layers
    heads = engine._model.config.num_key_value_heads
    fp8 = _logits(engine, KVPolicy(cache_dtype="fp8"), prompt_ids)
    scales = {i: torch.linspace(0.01, 0.05, heads) for i in range(n)}
    per_head = _logits(engine, KVPolicy(cache_dtype="fp8", k_scales=scales, v_scales=scales), prompt_ids)
    attn = _logits(engine, KVPolicy(cache_dtype="fp8", quantize_attention=True), prompt_ids)
    assert not torch.equal(per_head, fp8)
    assert not torch.equal(attn, fp8)
    assert (attn.argmax(-1) == fp8.argmax(-1)).float().mean().item() > 0.5  # still the same model


def test_generation_is_seeded_and_one_prefill_serves_n(engine):
    req = Request(id="g", messages=({"role": "user", "content": "Name three colours."},), n=2, seeds=(1, 2),
                  sampling={"temperature": 0.8, "top_p": 0.95, "max_tokens": 12})
    engine._shared["active_policy"] = engine._policy
    a = engine._generate_one(req)
    b = engine._generate_one(req)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.prompt_tokens == engine.count_prompt_tokens(req)
    greedy = Request(id="h", messages=req.messages, n=1, seeds=(5,), sampling={"temperature": 0, "max_tokens": 8})
    out = engine._generate_one(greedy)
    assert out.choices[0].finish_reason in ("stop", "length") and out.choices[0].output_tokens <= 8


def _decode_logits(model, policy_holder: dict, policy: KVPolicy, ids: torch.Tensor, chunk: int, steps: int):
    from transformers import DynamicCache

    policy_holder["active_policy"] = policy
    out_logits = []
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        for s in range(0, ids.shape[1], chunk):
            logits = model(input_ids=ids[:, s:s + chunk], past_key_values=cache, use_cache=True).logits[:, -1]
        out_logits.append(logits)
        for _ in range(steps):
            nxt = logits.argmax(-1, keepdim=True)
            logits = model(input_ids=nxt, past_key_values=cache, use_cache=True).logits[:, -1]
            out_logits.append(logits)
    return torch.stack(out_logits)


@pytest.mark.parametrize("cache_dtype", ["fp8", "auto"])
def test_incremental_in_place_rounding_equals_rounding_everything(engine, prompt_ids, cache_dtype):
    ids = prompt_ids[:, :300]
    inc = _decode_logits(engine._model, engine._shared, KVPolicy(cache_dtype=cache_dtype), ids, 128, 4)
    full = _decode_logits(engine._model, engine._shared, KVPolicy(cache_dtype=cache_dtype, incremental=False),
                          ids, 128, 4)
    assert torch.equal(inc, full)


@pytest.fixture(scope="module")
def gemma():
    try:
        cfg = compose(["model=gemma3-270m", "kv=fp8_skip_sw", "engine.threads=2"])
        eng = ReferenceEngine(cfg, cfg.kv, shared={})
        eng._load()
    except Exception as e:
        pytest.skip(f"gemma3 embedded model unavailable: {e}")
    return eng


def test_sliding_window_layers_skip_and_cache_cropping(gemma):
    """gemma3-270m: 5 sliding-window layers (window 512) per global one, head_dim 256, no chat template."""
    cfg = gemma._model.config
    sliding = tuple(str(i) for i, t in enumerate(cfg.layer_types) if "sliding" in t)
    assert 0 < len(sliding) < cfg.num_hidden_layers and cfg.head_dim == 256
    req = Request(id="g", messages=({"role": "user", "content": haystack_text(4000)},), n=1, seeds=(0,), sampling={})
    ids = torch.tensor([gemma.prompt_ids(req)])[:, :700]  # past the 512-token window: the cache crops
    by_type = _decode_logits(gemma._model, gemma._shared, KVPolicy(cache_dtype="fp8", skip_layers=("sliding_window",)),
                             ids, 256, 3)
    by_index = _decode_logits(gemma._model, gemma._shared, KVPolicy(cache_dtype="fp8", skip_layers=sliding), ids, 256, 3)
    everywhere = _decode_logits(gemma._model, gemma._shared, KVPolicy(cache_dtype="fp8"), ids, 256, 3)
    full_requant = _decode_logits(gemma._model, gemma._shared, KVPolicy(cache_dtype="fp8", incremental=False),
                                  ids, 256, 3)
    assert torch.equal(by_type, by_index)
    assert not torch.equal(by_type, everywhere)
    assert torch.equal(everywhere, full_requant)
