import pytest
import torch

from fp8eval.core.quant import fp8_roundtrip


def test_e4m3_saturates_instead_of_nan():
    x = torch.tensor([1000.0, -1000.0, 448.0, 3.3, 0.0])
    y = fp8_roundtrip(x, 1.0)
    assert torch.isfinite(y).all()
    assert y[0] == 448.0 and y[1] == -448.0 and y[2] == 448.0
    # 3.3 lies between the e4m3 neighbours 3.25 and 3.5: nearest is 3.25.
    assert y[3] == 3.25 and y[4] == 0.0
    # Values just past the max (and inf) saturate too, whatever the cast of this torch build does.
    z = fp8_roundtrip(torch.tensor([464.0, 10_000.0, float("inf")]), 1.0)
    assert z.tolist() == [448.0, 448.0, 448.0]


def test_round_to_nearest_even():
    # 17 lies exactly between 16 and 18 in e4m3 (step 2 in [16, 32)): ties go to the even mantissa, 16.
    # 19 lies between 18 and 20: ties to 20 (mantissa of 20 is even).
    y = fp8_roundtrip(torch.tensor([17.0, 19.0]), 1.0)
    assert y.tolist() == [16.0, 20.0]


def test_scale_divides_then_multiplies_back():
    x = torch.tensor([896.0, 2000.0])
    y = fp8_roundtrip(x, 2.0)
    assert y.tolist() == [896.0, 896.0]  # 2000/2 saturates at 448, times 2


def test_per_head_scales_broadcast_over_heads():
    x = torch.full((1, 3, 4, 8), 500.0)  # [B, H, T, D]
    scales = torch.tensor([1.0, 2.0, 4.0])
    y = fp8_roundtrip(x, scales)
    assert y[0, 0].unique().tolist() == [448.0]  # saturated with scale 1
    assert y[0, 1].unique().tolist() == [512.0]  # 250 -> 256 (e4m3 step 16 near 256), x2
    assert y[0, 2].unique().tolist() == [512.0]  # 125 -> 128 (step 8 in [64, 128)), x4
    assert torch.equal(y[0, 2], fp8_roundtrip(x[0, 2], 4.0))


def test_e5m2_range_and_precision():
    x = torch.tensor([60000.0, 1e6, 3.3])
    y = fp8_roundtrip(x, 1.0, fmt="e5m2")
    assert y[0] == 57344.0 and y[1] == 57344.0  # saturates at e5m2's max
    assert y[2] == 3.5  # 2 mantissa bits: 3.3 -> 3.5 (e4m3 gives 3.25)


def test_keeps_dtype_and_rejects_unknown_format():
    x = torch.randn(4, dtype=torch.bfloat16)
    assert fp8_roundtrip(x, 1.0).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="valid"):
        fp8_roundtrip(x, 1.0, fmt="e3m4")
