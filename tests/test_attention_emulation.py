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
