"""Public helper named in the README: `fp8eval.quant.fp8_roundtrip(x, scale, fmt)` (lives in core)."""

from fp8eval.core.quant import KV_CACHE_DTYPE_FORMAT, fp8_roundtrip

__all__ = ["KV_CACHE_DTYPE_FORMAT", "fp8_roundtrip"]
