"""fp8eval: how much accuracy an FP8 KV cache keeps, measured as paired recovery against BF16."""

__version__ = "0.1.0"
