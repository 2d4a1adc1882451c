"""The reference engine's FP8 attention emulations (kv.attention, kv.accumulation), on small random tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fp8eval.engines import attention_emulation as AE  # noqa: E402
from fp8eval.quant import fp8_roundtrip  # noqa: E402


def _qkv(lq=64, lk=64, h=2, d=64, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, h, lq, d, generator=g) * spread
    k = fp8_roundtrip(torch.randn(1, h, lk, d, generator=g))
    v = fp8_roundtrip(torch.randn(1, h, lk, d, generator=g))
    return q, k, v


def _exact(q, k, v):
    lq, lk = q.shape[2], k.shape[2]
    mask = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2)


def _run(q, k, v, mode, acc="exact"):
    return AE.emulated_attention(q, k, v, None, q.shape[-1] ** -0.5, mode=mode, accumulation=acc, fmt="e4m3")


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_kv_only_exact_is_sdpa():
    q, k, v = _qkv(lq=48, lk=80)
    assert torch.allclose(_run(q, k, v, "kv_only"), _exact(q, k, v), atol=1e-5)


def test_fa3_single_block_by_hand():
    """One key block: O = Σ fp8(256·exp(s - max)) v / Σ 256·exp(s - max), with Q in FP8."""
    q, k, v = _qkv(lq=1, lk=40, h=1)
    qq = fp8_roundtrip(q)
    s = (qq @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    p = torch.exp(s - s.amax(-1, keepdim=True)) * 256
    want = (fp8_roundtrip(p) @ v) / p.sum(-1, keepdim=True)
    assert torch.allclose(_run(q, k, v, "fa3_fp8"), want.transpose(1, 2), atol=1e-6)


def test_fa3_keeps_p_in_range_where_unit_scale_flushes_it():
    """Long, flat attention (probabilities ~1/2048, below e4m3's smallest subnormal 2^-9): scale 1.0 flushes
    most of P to zero; FA3's max offset keeps it."""
    q, k, v = _qkv(lq=8, lk=2048, spread=0.05)
    exact = _exact(q, k, v)
    fa3 = _rel(_run(q, k, v, "fa3_fp8"), exact)
    unit = _rel(_run(q, k, v, "qp_unit_scale"), exact)
    assert fa3 < 0.05 and unit > 4 * fa3, (fa3, unit)


def test_fa3_blocks_are_visited_last_to_first():
    """With a running max, a block seen before the row's max was found is quantized at a larger scale:
    results differ from one block spanning all keys (an injected peak in the first block)."""
    q, k, v = _qkv(lq=1, lk=320, h=1, d=64)
    k[..., 5, :] = fp8_roundtrip(q[..., 0, :] * 0.5)  # the row's max lies in block 0, visited last
    blocked = _run(q, k, v, "fa3_fp8")
    assert AE.fa3_block_n(64) == 160
    one = AE.emulated_attention(q, k, v, None, q.shape[-1] ** -0.5, mode="fa3_fp8", accumulation="exact",
                                fmt="e4m3", sliding=False)
    assert torch.equal(blocked, one)  # deterministic
    qq = fp8_roundtrip(q)
    s = (qq @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    p = torch.exp(s - s.amax(-1, keepdim=True)) * 256
    final_max_only = ((fp8_roundtrip(p) @ v) / p.sum(-1, keepdim=True)).transpose(1, 2)
    assert not torch.allclose(blocked, final_max_only, atol=0, rtol=0)
    assert _rel(blocked, final_max_only) < 0.05


def test_fast_accumulation_model():
    g = torch.Generator().manual_seed(1)
    a = torch.rand(4, 4096, generator=g)
    b = torch.randn(4096, 8, generator=g)
    exact = a.double() @ b.double()
    assert torch.allclose(AE.fast_fp8_matmul(a, b, bits=52).double(), exact, rtol=1e-6)
    err = {n: _rel(AE.fast_fp8_matmul(a[:, :n], b[:n]).double(), a[:, :n].double() @ b[:n].double())
           for n in (256, 4096)}
    assert 0 < err[256] < err[4096] < 1e-2, err
    coarse = _rel(AE.fast_fp8_matmul(a, b, align="sum").double(), exact)
    assert 0 < coarse < 1e-2 and coarse != err[4096]
    # truncation toward zero on the larger exponent's grid
    acc, part = torch.tensor([1.0], dtype=torch.float64), torch.tensor([2.0 ** -20], dtype=torch.float64)
    assert AE.truncating_add(acc, part, bits=13).item() == 1.0
    assert AE.truncating_add(acc, part, bits=30).item() == 1.0 + 2.0 ** -20


def test_fast_accumulation_in_attention_changes_little_at_short_context():
    q, k, v = _qkv(lq=16, lk=256)
    exact = _run(q, k, v, "fa3_fp8")
    fast = _run(q, k, v, "fa3_fp8", "fast_fp8")
    assert 0 < _rel(fast, exact) < 1e-2


def test_unknown_names_fail_with_the_valid_ones():
    q, k, v = _qkv(lq=2, lk=2)
    with pytest.raises(ValueError, match="kv_only, fa3_fp8, qp_unit_scale"):
        _run(q, k, v, "fa4")
    with pytest.raises(ValueError, match="exact, fast_fp8"):
        _run(q, k, v, "kv_only", "slow")


def test_fa3_decode_tiles_and_splits_follow_fa3s_heuristics():
    """The decode tiles (hopper/heuristics.h use_one_mma_wg, hopper/tile_size.h) and the split count (get_num_splits,
    then flash_prepare_scheduler.cu's dynamic count), worked by hand for SmolLM2's decode (head_dim 64, 3 KV heads of
    3 query heads each, 132 SMs): 4096 keys are 32 blocks of 128; occupancy 3 s / 132 is best at s = 32 (0.727), 85 %
    of that first reached at s = 28; blocks_per_sm = ceil(32 * 1.1 * 3 / 132) = 1, so 28 splits of ceil(32 / 28) = 2
    blocks: 16 non-empty ranges."""
    assert AE.fa3_decode_block_n(64, rows=3) == 128 and AE.fa3_decode_block_n(128, rows=8) == 96
    assert AE.fa3_decode_block_n(64, rows=65) is None  # more rows than one warpgroup: the prefill tiles
    assert AE.fa3_decode_block_n(256, rows=4) is None and AE.fa3_decode_block_n(64, rows=3, sliding=True) is None
    assert AE.fa3_num_splits(32, kv_heads=3) == 28
    assert AE.fa3_num_splits(4, kv_heads=3) == 1  # at most 4 blocks: never split
    assert AE.fa3_num_splits(32, kv_heads=3, batch=8) == 5  # blocks_per_sm = ceil(8 * 32 * 1.1 * 3 / 132) = 7
    ranges = AE.split_ranges(4096, 128, 28)
    assert len(ranges) == 16 and ranges[0] == (0, 256) and ranges[-1] == (3840, 4096)
    assert AE.split_ranges(300, 128, 1) == [(0, 300)]
    # gemma3-270m's full-attention layers (head_dim 256, 1 KV head): the prefill tiles, split all the same: 2048 keys are
    # 16 blocks; occupancy s / 132 is best at s = 16, 85 % first at s = 14; ceil(16 / 14) = 2 blocks a split: 8 splits
    assert AE.fa3_num_splits(16, kv_heads=1) == 14 and len(AE.split_ranges(2048, AE.fa3_block_n(256), 14)) == 8


def test_fa3_decode_step_splits_the_keys_and_stays_close_to_exact():
    """A decode step (one query row) of 4096 keys runs 16 splits, each with its own running max, combined by their
    log-sum-exps: not the bits of one unsplit pass, as close to exact attention, and deterministic. A prefill chunk's
    numbers do not change with the decode rule (the prefill tiles: rows above one warpgroup)."""
    q, k, v = _qkv(lq=1, lk=4096, h=3, d=64, seed=3, spread=3.0)
    q = q.repeat_interleave(3, dim=1)  # 9 query heads over 3 KV heads, as SmolLM2
    got = _run(q, k, v, "fa3_fp8")
    assert torch.equal(got, _run(q, k, v, "fa3_fp8"))
    scale = q.shape[-1] ** -0.5
    qs = fp8_roundtrip(q).reshape(1, 3, 3, 64)
    s = torch.matmul(qs, k.transpose(-1, -2)) * scale
    one = AE._fa3_rows(s.clone(), v, "e4m3", 128, "exact").view(1, 1, 9, -1)
    assert not torch.equal(got, one)
    exact = _exact(fp8_roundtrip(q), k.repeat_interleave(3, 1), v.repeat_interleave(3, 1))  # Q as the kernel reads it
    assert _rel(got, exact) < 0.05 and _rel(one, exact) < 0.05, (_rel(got, exact), _rel(one, exact))
    # a prefill chunk of 70 query rows (x 3 heads per KV head > 64) keeps the prefill tiles: the same bits as when
    # the decode rule is switched off
    qp, kp, vp = _qkv(lq=70, lk=400, h=3, d=64, seed=4)
    with_rule = _run(qp, kp, vp, "fa3_fp8")
    import unittest.mock

    with unittest.mock.patch.object(AE, "fa3_decode_block_n", lambda *a, **k: None):
        assert torch.equal(with_rule, _run(qp, kp, vp, "fa3_fp8"))
