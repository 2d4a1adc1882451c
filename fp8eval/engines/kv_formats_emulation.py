"""What vLLM's other KV cache formats store, emulated on any device: one function per format that takes K or V
([..., head_dim], one row per token and head) and returns what the cache gives back when read.

Each rule was read from vLLM's kernels (paths relative to vllm/):

- `fp8_per_token_head`, `int8_per_token_head` (v1/attention/ops/triton_reshape_and_cache_flash.py,
  `_reshape_cache_per_token_head`; read by TRITON_ATTN's unified attention): per token and KV head,
  scale = max(amax / QMAX, 1e-6) in FP32 (QMAX 448 for e4m3, 127 for int8), q = x * (1 / scale) clamped to
  [QMIN, QMAX]; FP8 is then converted round-to-nearest-even, int8 is rounded half away from zero (+-0.5 then
  the integer store truncates; older releases of the kernel had no +-0.5, so the store truncated toward zero:
  `kv.int8_rounding=trunc`, kv option int8_per_token_head_trunc). Read back as q * scale (the scale multiplies the scores for K and P for V).
- `int4_per_token_head` (v1/attention/ops/int4_per_token_head.py): a randomized Hadamard transform first
  (y = H (d * x), H the unnormalised Sylvester matrix over the largest power-of-two block of head_dim, d fixed
  +-1 signs from torch's Bernoulli(0.5) under seed 0x9E3779B9), cast to the model dtype; then asymmetric
  4-bit per token and head: scale = max((max - min) / 15, 1e-6), zero point zp = clamp(round(-min / scale),
  0, 15), q = clamp(round(y / scale + zp), 0, 15), rounding half away from zero; zp is hidden in the low 4
  mantissa bits of the stored FP32 scale, so the read scale has those bits cleared. The kernel attends in the
  rotated space (Q rotated, output rotated back, scale / b): the same as attending over d * H (y_hat) / b.
  An earlier revision (in the search index) quantized unrotated: `kv.int4_rht=false`, kv option
  int4_per_token_head_norht.
- TurboQuant (model_executor/layers/quantization/turboquant/, v1/attention/ops/triton_turboquant_store.py,
  triton_turboquant_decode.py, v1/attention/backends/turboquant_attn.py): keys either FP8 e4m3 at scale 1
  (`k8`) or, for 3/4-bit keys, norm = ||k||, y = (k / (norm + 1e-8)) H (H the orthonormal D x D Hadamard),
  each coordinate replaced by its Lloyd-Max centroid for N(0, 1/D) (bucketized at the centroids' midpoints),
  with `_nc` the centroid vector renormalised to unit length, rotated back and multiplied by the FP16 norm.
  Values: asymmetric uniform per token and head over head_dim, scale = max((max - min) / (2^b - 1), 1e-8),
  q = clamp(trunc((v - min) / scale + 0.5), 0, 2^b - 1), read as q * fp16(scale) + fp16(min). Prefill:
  a first chunk, and a continuation chunk of more than 128 tokens, attend to their own raw K/V (FlashAttention
  on the unquantized chunk); chunks of at most 128 tokens and decode read everything from the cache. So a
  one-chunk prefill (what prompt_logprobs does by default) shows no TurboQuant error at all: measure it with
  prefill chunks of 128 tokens (reference: engine.prefill_chunk=128; vLLM: max_num_batched_tokens=128).
- `nvfp4` (FlashInfer's quantize-append kernel, outside vLLM's tree: the NVFP4 recipe, not its code): blocks of
  16 values along head_dim, block scale = e4m3(amax / 6 / global) with global the layer's per-tensor scale
  (1.0 uncalibrated), values rounded to nearest even on the e2m1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating.
  `nvfp4_4over6` takes, per block, whichever of amax / 6 and amax / 4 gives the smaller squared error.
- `fp8_ds_mla` (DeepSeek sparse MLA): the 512 NoPE values in 4 tiles of 128, each tile with an FP32 scale
  amax / 448 and e4m3 values, the 64 RoPE values in BF16. MLA models only: the reference engine runs none.
"""

from __future__ import annotations

import functools
import math

import torch

from fp8eval.core.kvformats import REFERENCE_EMULATED, TQ_PRESETS
from fp8eval.core.quant import FP8_MAX

PER_TOKEN_HEAD_FLOOR = 1e-6
TQ_VALUE_FLOOR = 1e-8
TQ_CHUNK_RAW_ABOVE = 128  # _CONTINUATION_DECODE_THRESHOLD: longer chunks attend to their own raw K/V
RHT_SEED = 0x9E3779B9
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NVFP4_BLOCK = 16
DS_MLA_TILE = 128


def _half_away(x: torch.Tensor) -> torch.Tensor:
    """Round half away from zero, as `x + 0.5 * sign(x)` followed by a truncating integer store."""
    return torch.trunc(torch.where(x >= 0, x + 0.5, x - 0.5))


def per_token_head_roundtrip(x: torch.Tensor, kind: str, int8_rounding: str = "half_away") -> torch.Tensor:
    """fp8_per_token_head (kind "fp8") or int8_per_token_head (kind "int8"): quantized per row of head_dim and read
    back, in x's dtype. `int8_rounding`: half_away (+-0.5, then the truncating store) or trunc (the store alone,
    toward zero: the kernel before vLLM added the +-0.5)."""
    xf = x.float()
    qmax, qmin = (FP8_MAX["e4m3"], -FP8_MAX["e4m3"]) if kind == "fp8" else (127.0, -128.0)
    scale = (xf.abs().amax(-1, keepdim=True) / qmax).clamp_min(PER_TOKEN_HEAD_FLOOR)
    q = xf * (1.0 / scale)
    if kind == "fp8":
        q = q.clamp(qmin, qmax).to(torch.float8_e4m3fn).float()
    elif kind == "int8" and int8_rounding == "trunc":
        q = torch.trunc(q.clamp(qmin, qmax))
    elif kind == "int8":
        q = torch.trunc(torch.where(q >= 0, q + 0.5, q - 0.5).clamp(qmin, qmax))
    else:
        raise ValueError(f"per-token-head kind={kind!r}; valid: fp8, int8")
    return (q * scale).to(x.dtype)


def _pow2_block(d: int) -> int:
    return d & -d


@functools.lru_cache(maxsize=16)
def rht_signs(block: int) -> torch.Tensor:
    """The fixed +-1 signs of int4_per_token_head's randomized Hadamard transform (CPU, float32)."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(RHT_SEED)
    return 2.0 * torch.bernoulli(torch.full((block,), 0.5), generator=gen) - 1.0


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised Walsh-Hadamard transform (Sylvester order) over the last dimension (a power of two)."""
    d = x.shape[-1]
    if d & (d - 1):
        raise ValueError(f"Hadamard transform needs a power-of-two size, got {d}")
    h = 1
    while h < d:
        v = x.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        x = torch.stack([v[..., 0, :] + v[..., 1, :], v[..., 0, :] - v[..., 1, :]], dim=-2).reshape(x.shape)
        h *= 2
    return x


def _rht(x: torch.Tensor, inverse: bool) -> torch.Tensor:
    d = x.shape[-1]
    b = _pow2_block(d)
    xb = x.reshape(*x.shape[:-1], d // b, b)
    s = rht_signs(b).to(x.device, x.dtype)
    y = hadamard(xb) * s if inverse else hadamard(xb * s)
    return y.reshape(x.shape)


def int4_per_token_head_roundtrip(x: torch.Tensor, model_dtype: torch.dtype = torch.bfloat16,
                                  rht: bool = True) -> torch.Tensor:
    """int4_per_token_head: rotate (the rotated K/V cast to the model dtype, as vLLM does), asymmetric 4-bit per row
    with the zero point in the scale's low bits, read back and rotated back (the kernel's attention in the rotated
    space, expressed on the unrotated K/V)."""
    if not rht:  # an earlier revision of the kernel: the same quantizer on the unrotated K/V
        return int4_asymmetric(x.float()).to(x.dtype)
    b = _pow2_block(x.shape[-1])
    y = _rht(x.float(), inverse=False).to(model_dtype).float()
    return (_rht(int4_asymmetric(y), inverse=True) / b).to(x.dtype)


def int4_asymmetric(y: torch.Tensor) -> torch.Tensor:
    """int4_per_token_head's quantizer on already-rotated rows (float32 in and out): scale = max((max - min) / 15,
    1e-6), zp and q rounded half away from zero and clamped to [0, 15], read as (q - zp) times the scale with its
    low 4 bits (where zp is kept) cleared."""
    lo, hi = y.amin(-1, keepdim=True), y.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15.0).clamp_min(PER_TOKEN_HEAD_FLOOR)
    zp = _half_away(-lo / scale).clamp(0.0, 15.0)
    q = _half_away(y * (1.0 / scale) + zp).clamp(0.0, 15.0)
    read_scale = (scale.view(torch.int32) & -16).view(torch.float32)
    return (q - zp) * read_scale


@functools.lru_cache(maxsize=16)
def lloyd_max_centroids(d: int, bits: int) -> tuple[float, ...]:
    """Lloyd-Max centroids of N(0, 1/d) with 2**bits levels, solved as TurboQuant solves them (start evenly over
    +-3.5 sigma, trapezoid integrals of 200 steps over [edge_i, edge_i+1] with the outer edges at +-10.5 sigma,
    at most 200 iterations, stop when no centroid moves by 1e-10)."""
    n = 2 ** bits
    var = 1.0 / d
    sigma = math.sqrt(var)
    pdf = lambda t: math.exp(-t * t / (2 * var)) / math.sqrt(2 * math.pi * var)  # noqa: E731

    def trapz(f, a, b, steps=200):
        h = (b - a) / steps
        return h * (0.5 * (f(a) + f(b)) + sum(f(a + i * h) for i in range(1, steps)))

    lo, hi = -3.5 * sigma, 3.5 * sigma
    c = [lo + (hi - lo) * (i + 0.5) / n for i in range(n)]
    for _ in range(200):
        edges = [3 * lo] + [(c[i] + c[i + 1]) / 2 for i in range(n - 1)] + [3 * hi]
        new = []
        for i in range(n):
            den = trapz(pdf, edges[i], edges[i + 1])
            new.append(trapz(lambda t: t * pdf(t), edges[i], edges[i + 1]) / den if den > 1e-15 else c[i])
        moved = max(abs(a - b) for a, b in zip(new, c))
        c = new
        if moved < 1e-10:
            break
    return tuple(float(torch.tensor(v, dtype=torch.float32)) for v in c)


def tq_key_roundtrip(k: torch.Tensor, bits: int, norm_correction: bool) -> torch.Tensor:
    """TurboQuant's key: FP8 e4m3 at scale 1 (bits 8) or normalise, rotate, Lloyd-Max centroid per coordinate,
    (renormalise), rotate back, times the FP16 norm."""
    kf = k.float()
    if bits == 8:
        return kf.clamp(-FP8_MAX["e4m3"], FP8_MAX["e4m3"]).to(torch.float8_e4m3fn).float().to(k.dtype)
    d = kf.shape[-1]
    norm = kf.norm(dim=-1, keepdim=True)
    y = hadamard(kf / (norm + 1e-8)) / math.sqrt(d)
    cent = torch.tensor(lloyd_max_centroids(d, bits), dtype=torch.float32, device=k.device)
    mids = (cent[:-1] + cent[1:]) / 2
    idx = torch.bucketize(y, mids, right=True)  # y >= midpoint goes up, as the kernel's binary search
    c = cent[idx]
    if norm_correction:
        c = c / torch.sqrt((c * c).sum(-1, keepdim=True) + 1e-16)
    return (norm.half().float() * hadamard(c) / math.sqrt(d)).to(k.dtype)


def tq_value_roundtrip(v: torch.Tensor, bits: int) -> torch.Tensor:
    """TurboQuant's value: asymmetric uniform `bits`-bit per row, min as the zero, scale and min stored in FP16."""
    vf = v.float()
    lo, hi = vf.amin(-1, keepdim=True), vf.amax(-1, keepdim=True)
    top = float(2 ** bits - 1)
    scale = (hi - lo) / top
    scale = torch.where(scale > TQ_VALUE_FLOOR, scale, torch.full_like(scale, TQ_VALUE_FLOOR))
    q = torch.trunc((vf - lo) / scale + 0.5).clamp(0.0, top)
    return (q * scale.half().float() + lo.half().float()).to(v.dtype)


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e2m1 (FP4) value, ties to the even code, saturating at +-6."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=x.device)
    a = x.abs().clamp(max=6.0)
    hi_i = torch.bucketize(a, grid).clamp(max=len(E2M1_GRID) - 1)
    lo_i = (hi_i - 1).clamp(min=0)
    lo, hi = grid[lo_i], grid[hi_i]
    d_lo, d_hi = a - lo, hi - a
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi_i % 2 == 0))
    return torch.sign(x) * torch.where(take_hi, hi, lo)


def nvfp4_roundtrip(x: torch.Tensor, global_scale: float = 1.0, four_over_six: bool = False) -> torch.Tensor:
    """NVFP4: blocks of 16 along head_dim, an e4m3 block scale of amax / 6 (or the better of /6 and /4), e2m1
    values."""
    d = x.shape[-1]
    if d % NVFP4_BLOCK:
        raise ValueError(f"nvfp4 needs head_dim divisible by {NVFP4_BLOCK}, got {d}")
    xb = x.float().reshape(*x.shape[:-1], d // NVFP4_BLOCK, NVFP4_BLOCK)
    amax = xb.abs().amax(-1, keepdim=True)

    def with_max(m: float) -> torch.Tensor:
        s = (amax / m / global_scale).clamp(max=FP8_MAX["e4m3"]).to(torch.float8_e4m3fn).float() * global_scale
        safe = torch.where(s > 0, s, torch.ones_like(s))
        return torch.where(s > 0, e2m1_round(xb / safe) * s, torch.zeros_like(xb))

    out = with_max(6.0)
    if four_over_six:
        alt = with_max(4.0)
        better = ((alt - xb) ** 2).sum(-1, keepdim=True) < ((out - xb) ** 2).sum(-1, keepdim=True)
        out = torch.where(better, alt, out)
    return out.reshape(x.shape).to(x.dtype)


def ds_mla_roundtrip(nope: torch.Tensor, rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8_ds_mla: the NoPE part in tiles of 128 with an FP32 amax / 448 scale each (e4m3), the RoPE part in BF16."""
    d = nope.shape[-1]
    if d % DS_MLA_TILE:
        raise ValueError(f"fp8_ds_mla needs a NoPE width divisible by {DS_MLA_TILE}, got {d}")
    t = nope.float().reshape(*nope.shape[:-1], d // DS_MLA_TILE, DS_MLA_TILE)
    s = t.abs().amax(-1, keepdim=True) / FP8_MAX["e4m3"]
    safe = torch.where(s > 0, s, torch.ones_like(s))
    q = (t / safe).clamp(-FP8_MAX["e4m3"], FP8_MAX["e4m3"]).to(torch.float8_e4m3fn).float() * s
    return q.reshape(nope.shape).to(nope.dtype), rope.to(torch.bfloat16).to(rope.dtype)


# kv_cache_dtype -> (key round trip, value round trip); the model's attention then runs exactly.
def roundtrips(cache_dtype: str, global_scale: float = 1.0, int8_rounding: str = "half_away", int4_rht: bool = True):
    """The (K, V) read-back functions of a format the reference engine emulates; ValueError for any other."""
    if cache_dtype in ("fp8_per_token_head", "int8_per_token_head"):
        kind = cache_dtype.split("_")[0]
        f = functools.partial(per_token_head_roundtrip, kind=kind, int8_rounding=int8_rounding)
        return f, f
    if cache_dtype == "int4_per_token_head":
        f = functools.partial(int4_per_token_head_roundtrip, rht=int4_rht)
        return f, f
    if cache_dtype in TQ_PRESETS:
        kb, vb, nc = TQ_PRESETS[cache_dtype]
        return functools.partial(tq_key_roundtrip, bits=kb, norm_correction=nc), functools.partial(tq_value_roundtrip, bits=vb)
    if cache_dtype in ("nvfp4", "nvfp4_4over6"):
        f = functools.partial(nvfp4_roundtrip, global_scale=global_scale, four_over_six=cache_dtype == "nvfp4_4over6")
        return f, f
    raise ValueError(f"no reference emulation of kv_cache_dtype={cache_dtype!r}; emulated: {', '.join(EMULATED)}")


EMULATED = REFERENCE_EMULATED
