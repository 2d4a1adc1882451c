"""The reference engine's speed-ups compute the same bits as what they replaced (issue 26): FP8 rounding by float32
arithmetic against torch's cast, the reserved KV cache against transformers' DynamicCache, exact attention's
shared V-with-ones against a per-slice one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fp8eval.core.quant import FP8_DTYPE, FP8_MAX  # noqa: E402
from fp8eval.engines import attention_emulation as emu  # noqa: E402


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_rounding_matches_torch_cast_bit_for_bit(fmt):
    """Every 61st float32 bit pattern from 0 to the format's largest value, plus the neighbours of every FP8 value
    and of every midpoint between two of them (where ties to even decide). The whole range, every pattern, was
    checked once the same way: 0 mismatches in 1,138,753,537 (e4m3) and 1,197,473,793 (e5m2) patterns."""
    top = int(torch.tensor([FP8_MAX[fmt]]).view(torch.int32))
    dense = torch.arange(0, top + 1, 61, dtype=torch.int32)
    grid = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE[fmt]).float()
    grid = grid[torch.isfinite(grid) & (grid >= 0) & (grid <= FP8_MAX[fmt])].sort().values
    mids = (grid[:-1].double() + grid[1:].double()).div(2).float()
    anchors = torch.cat([grid, mids]).view(torch.int32)
    near = (anchors.unsqueeze(1) + torch.arange(-2, 3, dtype=torch.int32)).reshape(-1).clamp(0, top)
    x = torch.cat([dense, near]).view(torch.float32)
    want = x.to(FP8_DTYPE[fmt]).float()
    got = emu._to_fp8_in_place(x.clone(), fmt)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert int((got != x).sum()) > 0  # it rounded something


def test_exact_attention_with_shared_ones_column_matches_per_slice_one():
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 9, 300, 64, generator=g) * 3, torch.randn(1, 3, 300, 64, generator=g) * 3
    v = torch.randn(1, 3, 300, 64, generator=g)
    got = emu.emulated_attention(q, k, v, None, 0.125, mode="kv_only", accumulation="exact", fmt=None)
    assert got.shape == (1, 300, 9, 64)
    # One slice by hand the old way (its own cat of V and ones): the first 64 rows of head group 0.
    s = torch.matmul(q[:, :, :64].reshape(1, 3, 3 * 64, 64), k[:, :, :64].transpose(-1, -2)).mul_(0.125)
    s.view(1, 3, 3, 64, 64).masked_fill_(torch.ones(64, 64, dtype=torch.bool).triu(1), float("-inf"))
    p = emu._exp_in_place(s)
    nd = torch.matmul(p, torch.cat([v[:, :, :64], torch.ones(1, 3, 64, 1)], dim=-1))
    old = (nd[..., :-1] / nd[..., -1:]).view(1, 3, 3, 64, 64).reshape(1, 9, 64, 64).transpose(1, 2)
    assert torch.equal(got[:, :64], old)


@pytest.mark.slow
@pytest.mark.parametrize("kv", ["fp8", "bf16"])
def test_reserved_cache_gives_dynamic_cache_logits_bit_for_bit(kv):
    """Prefill, n=1 and n=2 decode (batch_repeat_interleave), growing past the reserved room: the same logits."""
    pytest.importorskip("transformers")
    from conftest import compose
    from transformers import DynamicCache

    from fp8eval.engines.reference import ReferenceEngine

    try:
        cfg = compose([f"kv={kv}", "engine.threads=2"])  # fp8: the default fa3_fp8 emulation
        eng = ReferenceEngine(cfg, cfg.kv, shared={})
        eng._load()
    except Exception as e:  # the embedded model package is part of the install; say so if it is missing
        pytest.skip(f"embedded model unavailable: {e}")
    eng._shared["active_policy"] = eng._policy
    model = eng._model

    from fp8eval.engines.reserved_cache import ReservedLayer, reserved_cache

    ids = torch.randint(0, 1000, (1, 200), generator=torch.Generator().manual_seed(0))

    def run(cache, n_repeat=1):
        outs = []
        with torch.inference_mode():
            outs.append(model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits)
            if n_repeat > 1:
                cache.batch_repeat_interleave(n_repeat)
            nxt = torch.full((n_repeat, 1), 5)
            for step in range(6):
                outs.append(model(input_ids=nxt + step, past_key_values=cache, use_cache=True).logits)
        return outs

    for n in (1, 2):
        small = reserved_cache(model.config, 203)  # grows past its room during decode
        assert any(isinstance(x, ReservedLayer) for x in small.layers)
        for a, b in zip(run(DynamicCache(config=model.config), n), run(small, n)):
            assert torch.equal(a, b)
