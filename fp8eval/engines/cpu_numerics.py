"""Reproducible CPU numerics for the reference engine: the same records with any thread count, CPU vector
width (`ATEN_CPU_CAPABILITY`) and machine load.

What moved answers before (issue 26, measured on the embedded SmolLM2): MKL's float32 matrix products
(torch's CPU BLAS) choose their kernel and how they split work by thread count and CPU, and SDPA's CPU kernel
sums in an order that follows the vector width (AVX2 vs AVX-512) and splits decode work across threads. The
reference engine therefore runs (1) MKL in its strict conditional-numerical-reproducibility mode (`AUTO,STRICT`:
matrix products give the same bits with any number of threads; `MKL_CBWR` holds the same setting as an
environment variable) and (2) fp8eval's own attention on CPU for every layer (matrix products and elementwise
steps only: fp8eval/engines/attention_emulation.py). Both are part of the arm's fingerprint (`describe()`).
MKL's AUTO branch is chosen per CPU family: two different CPU families may still differ in the last bits
(MKL's COMPATIBLE branch would remove that at about half the matrix-product speed; not used).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

MKL_CBWR = "AUTO,STRICT"
# MKL's constants (mkl_cbwr.h): the branch in the low bits, STRICT as a flag.
_ALL, _AUTO, _STRICT = -1, 2, 0x10000
_SUCCESS = 0


def describe() -> dict:
    """What the fingerprint records about CPU numerics."""
    return {"mkl_cbwr": MKL_CBWR, "attention": "fp8eval"}


def _mkl():
    import torch

    if not torch.backends.mkl.is_available():
        return None
    lib_dir = Path(torch.__file__).resolve().parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib"):
        if (lib_dir / name).exists():
            lib = ctypes.CDLL(str(lib_dir / name))
            if hasattr(lib, "mkl_serv_cbwr_get") and hasattr(lib, "mkl_serv_cbwr_set"):
                lib.mkl_serv_cbwr_get.argtypes = [ctypes.c_int]
                lib.mkl_serv_cbwr_set.argtypes = [ctypes.c_int]
                return lib
    return None


def pin() -> str:
    """Put MKL into AUTO,STRICT mode (before its first product in this process); returns the mode in effect.
    Raises RuntimeError when MKL already runs in another mode that can no longer be changed."""
    lib = _mkl()
    if lib is None:
        return "no-mkl"
    mode = lib.mkl_serv_cbwr_get(_ALL)
    if mode != (_AUTO | _STRICT):
        rc = lib.mkl_serv_cbwr_set(_AUTO | _STRICT)
        mode = lib.mkl_serv_cbwr_get(_ALL)
        if mode != (_AUTO | _STRICT):
            raise RuntimeError(
                f"MKL runs in reproducibility mode {mode:#x} (set {rc}), not {MKL_CBWR}: something used MKL in this "
                f"process before the reference engine could pin it. Start a fresh process, or set "
                f"MKL_CBWR={MKL_CBWR} in the environment.")
    return MKL_CBWR
