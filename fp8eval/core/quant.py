"""FP8 quantization emulated the way vLLM stores its KV cache.

vLLM writes K and V into an FP8 cache as `fp8(x / scale)` with saturation to the format's largest finite
value (448 for e4m3, 57344 for e5m2), converting with round-to-nearest-even, and reads them back as
`float(fp8) * scale`. torch's float -> float8 casts round to nearest even; whether they saturate has
varied across builds and devices (NaN for e4m3fn on some), hence the explicit clamp.
"""

from __future__ import annotations

import torch

FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
FP8_DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}

# vLLM's names for the cache dtype -> our format names.
KV_CACHE_DTYPE_FORMAT = {"fp8": "e4m3", "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}


def _as_scale(scale, x: torch.Tensor, head_dim: int) -> torch.Tensor:
    s = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    if s.ndim == 1 and s.numel() > 1:
        # One scale per head: align it with the head dimension of x ([B, H, T, D] by default).
        shape = [1] * x.ndim
        shape[head_dim] = s.numel()
        s = s.reshape(shape)
    return s


def fp8_roundtrip(x: torch.Tensor, scale=1.0, fmt: str = "e4m3", head_dim: int = 1) -> torch.Tensor:
    """Quantize x to FP8 and back, returning a tensor of x's dtype.

    `scale` is a float or a tensor: a scalar (per tensor), or one value per head (a 1-D tensor aligned
    with dimension `head_dim` of x), or anything broadcastable over x.
    """
    if fmt not in FP8_MAX:
        raise ValueError(f"unknown FP8 format {fmt!r}; valid: {', '.join(FP8_MAX)}")
    s = _as_scale(scale, x, head_dim)
    limit = FP8_MAX[fmt]
    q = (x.float() / s).clamp(-limit, limit).to(FP8_DTYPE[fmt])
    return (q.float() * s).to(x.dtype)
