"""FP8 attention kernels emulated on any device: what the reference engine runs for `kv.attention` and
`kv.accumulation` other than the defaults.

`kv.attention` (which tensors are FP8 inside attention; K and V are always stored as the FP8 cache holds them):

- `kv_only`: only K and V are rounded (the cache); the rest is exact (SDPA). The default.
- `fa3_fp8`: FlashAttention-3's FP8 forward (hopper/, what vLLM's FLASH_ATTN runs on an H100/H200 with an FP8
  cache): Q is quantized to FP8 too (vLLM passes q_scale, 1.0 uncalibrated), S = Q·Kᵀ accumulates in FP32,
  then the online softmax works block by block over the keys (kBlockN keys a block, visited from the last
  block back to the first): P = exp2(S·log2e·scale − (m·log2e·scale − 8)), m the row's running max, so P lies in
  [0, 2⁸] and uses e4m3's range instead of [0, 1] (hopper/softmax.h, `Max_offset = 8` for FP8). P is
  converted to FP8 (round to nearest) for the P·V tensor-core product, while the row sum is taken from the
  unconverted FP32 P; when the running max grows, O and the row sum are rescaled by exp(m_old − m_new) in
  FP32; at the end O is divided by the row sum (the 2⁸ cancels) and multiplied by v_descale.
- `qp_unit_scale`: Q and P rounded to FP8 with scale 1.0 and P normalised first (the old
  `kv.quantize_attention=true`): probabilities below e4m3's smallest subnormal (2⁻⁹) flush to zero, so it
  overstates the error more and more with context (issue 18). Kept for comparison.

`kv.accumulation` (how P·V is summed): `exact` (FP32), `fast_fp8`: an FP8 tensor-core MMA whose partial sums
are promoted to FP32 every FAST_ACC_PROMOTE_EVERY keys (what torch._scaled_mm's fast accumulation measured on an
H200), or `fa3_unfixed`: the same MMA never promoted across the context, the keys in FA3's block order with its
rescaling (the seed's FA3 before the two-level fix: one reduced-precision accumulator over the whole context). Hopper's FP8 MMA adds each k-step's products into an accumulator that keeps only about
14 significant bits (DeepSeek-V3 report, section 3.3.2: "limited to retaining around 14 bits"); CUTLASS and
DeepGEMM therefore promote partial sums to FP32 CUDA-core registers every few k-steps ("two-level"
accumulation, what cuBLAS does unless `fast accum` is set). Modelled here as: the K dimension is walked in
k-steps of FAST_ACC_K (32, one FP8 WGMMA k-step); each step's exact products and the running accumulator
are aligned to the largest of their exponents and truncated (toward zero) to FAST_ACC_BITS bits below it,
then added (what studies of tensor-core adders describe: products shifted to the largest exponent, the
bits shifted out dropped). The error this model gives vs context length is what `python -m fp8eval.probe --emulate`
prints, to be set against the hardware's (`python -m fp8eval.probe` on a GPU with FP8 tensor cores).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from fp8eval.config import ACCUMULATION_MODES, ATTENTION_MODES
from fp8eval.core.quant import fp8_roundtrip

FAST_ACC_K = 32  # keys per FP8 WGMMA k-step (32 bytes of K per instruction)
FAST_ACC_BITS = 13  # fraction bits kept below the leading bit: ~14 significant bits
# What a k-step aligns and truncates: "products" (each exact product and the accumulator, the model above) or
# "sum" (the step's exact sum and the accumulator: a coarser adder). `python -m fp8eval.probe --fit` on a GPU
# says which, and which width, matches the hardware.
FAST_ACC_ALIGN = "products"
# Keys summed in the reduced accumulator before its partial sum is added in FP32. Measured on an H200
# (docs/gpu-validation.md, `python -m fp8eval.probe`): torch._scaled_mm with use_fast_accum matches the
# unpromoted model above to 4 digits up to K = 4096 and its error stops growing after that (1.13e-3 at 8k,
# 1.19e-3 at 128k, against 1.4e-3 at 4k), the signature of partial sums combined in FP32 every 4096 keys.
FAST_ACC_PROMOTE_EVERY = 4096
FA3_MAX_OFFSET = 8  # P = exp2(x - (max - 8)) lies in [0, 256]
# Elements of one [heads, query rows, keys] score slice held at a time (at most ~1 GiB in float32).
_SLICE_ELEMENTS = 1 << 28
_SLICE_ROWS = 64
# The attribute under which a cache's V tensor [.., keys, D] may carry a view [.., keys, D + 1] of the same storage
# whose last column holds ones (fp8eval.engines.reserved_cache): exact attention's V-with-ones without a copy.
V_WITH_ONES = "_fp8eval_v_with_ones"


def fa3_block_n(head_dim: int, sliding: bool = False) -> int:
    """FA3's keys per block (kBlockN) for an FP8 forward on sm90 with a paged (non-TMA) KV cache, as vLLM
    runs it (hopper/tile_size.h, tile_size_fwd_sm90 with element_size 1)."""
    if head_dim <= 64:
        return 160
    if head_dim <= 96:
        return 128
    if head_dim <= 128:
        return 160
    if head_dim <= 192:
        return 128 if sliding else 160
    return 64 if sliding else 128


# FA3's decode path (vllm-project/flash-attention, hopper/, read at 28e862d, the FA pin of vLLM's July 2026 tree; the
# decode tiles are the same at 7d346be, January 2026): a batch whose rows (query tokens x query heads per KV head) fit
# one 64-row warpgroup runs the "one MMA warpgroup" FP8 tiles (heuristics.h lines 10-13 `use_one_mma_wg`: sm90,
# head_dim 64 or 128, not local, seqlen_q * (h / h_k) <= 64; tile_size.h lines 55-61, "Decode tiles": kBlockN 128 for
# head_dim <= 96, else 96), not the prefill tiles of fa3_block_n. A decode step also splits the keys (split-KV): the
# static count from get_num_splits (flash_api.cpp lines 468-498, heuristics.h lines 32-64), the dynamic one from
# flash_prepare_scheduler.cu lines 159-161, ceil(n_blocks / splits) blocks a split (block.h line 59); each split runs
# the online softmax over its own blocks with its own running max, and the combine kernel weighs the splits' FP32
# outputs by exp(lse_i - logsumexp) (flash_fwd_combine_kernel.h lines 582-606).
FA3_DECODE_ROWS = 64  # rows of one MMA warpgroup (kBlockM of the decode tiles)
FA3_NUM_SM = 132  # SMs of an H100 / H200 SXM: FA3's split heuristics spread the work over them
FA3_MAX_SPLITS = 128  # the cap get_num_splits passes (hopper/flash_api.cpp)


def fa3_decode_block_n(head_dim: int, rows: int, sliding: bool = False) -> int | None:
    """kBlockN of FA3's FP8 decode tiles when a batch of `rows` query rows per KV head runs them, else None (the
    prefill tiles, fa3_block_n): hopper/heuristics.h `use_one_mma_wg`, hopper/tile_size.h's FP8 decode branch."""
    if sliding or head_dim not in (64, 128) or rows > FA3_DECODE_ROWS:
        return None
    return 128 if head_dim <= 96 else 96


def _splits_heuristic(total_mblocks: int, num_sm: int, n_blocks: int, max_splits: int = FA3_MAX_SPLITS) -> int:
    """hopper/heuristics.h `num_splits_heuristic` (short rows: the L2 branch never applies to our sizes): the fewest
    splits whose SM occupancy reaches 85 % of the best."""
    if total_mblocks >= 0.8 * num_sm or n_blocks <= 4:
        return 1
    top = min(max_splits, num_sm, n_blocks)
    eff = []
    for s in range(1, top + 1):
        waves = float(np.float32(total_mblocks * s) / np.float32(num_sm))
        eff.append(waves / math.ceil(waves))
    best = max(eff)
    return next(s for s in range(1, top + 1) if eff[s - 1] >= 0.85 * best)


def fa3_num_splits(n_blocks: int, kv_heads: int, batch: int = 1, num_sm: int = FA3_NUM_SM) -> int:
    """How many splits FA3 gives one decode row of `n_blocks` key blocks, in a decode batch of `batch` sequences of
    that length, as vLLM runs it (AOT scheduler metadata, max_num_splits 0 in eager mode: vllm/v1/attention/backends/
    flash_attn.py): the static bound from get_num_splits (hopper/flash_api.cpp, total_mblocks = h_k with dynamic
    splits), then hopper/flash_prepare_scheduler.cu's dynamic count, blocks_per_sm = ceil(total_blocks * 1.1 * h_k /
    num_sm), splits = clamp(ceil(n_blocks / blocks_per_sm), 1, static)."""
    static = _splits_heuristic(kv_heads, num_sm, n_blocks)
    if static <= 1:
        return 1
    per_sm = math.ceil(float(np.float32(batch * n_blocks) * np.float32(1.1) * np.float32(kv_heads) / np.float32(num_sm)))
    return max(min(-(-n_blocks // max(per_sm, 1)), static), 1)


def split_ranges(n_keys: int, block_n: int, splits: int) -> list[tuple[int, int]]:
    """The key ranges [start, end) of each non-empty split (hopper/block.h: ceil(n_blocks / splits) blocks each)."""
    n_blocks = -(-n_keys // block_n)
    per = -(-n_blocks // max(1, splits))
    return [(b * block_n, min((b + per) * block_n, n_keys)) for b in range(0, n_blocks, per)]


def truncating_add(acc: torch.Tensor, part: torch.Tensor, bits: int = FAST_ACC_BITS) -> torch.Tensor:
    """acc + part as a reduced-precision accumulator adds them: both aligned to the larger exponent and
    truncated toward zero to `bits` fraction bits below it (float64 in, float64 out)."""
    return aligned_sum(acc, part.unsqueeze(-2), bits)


def aligned_sum(acc: torch.Tensor, terms: torch.Tensor, bits: int = FAST_ACC_BITS) -> torch.Tensor:
    """One MMA k-step: acc [..., M, N] plus terms [..., M, k, N] (the step's exact products), every addend
    aligned to the largest exponent among them and truncated toward zero to `bits` fraction bits below it,
    then summed exactly (float64)."""
    biggest = torch.maximum(acc.abs(), terms.abs().amax(dim=-2))
    _, exp = torch.frexp(biggest)
    grid = torch.ldexp(torch.ones_like(acc), (exp - 1 - bits).to(torch.int32))
    g = grid.unsqueeze(-2)
    return torch.trunc(acc / grid) * grid + (torch.trunc(terms / g) * g).sum(dim=-2)


def fast_fp8_matmul(a: torch.Tensor, b: torch.Tensor, k_step: int = FAST_ACC_K, bits: int = FAST_ACC_BITS,
                    order: torch.Tensor | None = None, align: str = FAST_ACC_ALIGN,
                    promote_every: int | None = FAST_ACC_PROMOTE_EVERY) -> torch.Tensor:
    """a [..., M, K] @ b [..., K, N] accumulated as an FP8 MMA without promotion (see the module docstring):
    per k-step of `k_step`, the exact products and the accumulator aligned to the largest exponent and
    truncated to `bits` fraction bits (`aligned_sum`).

    `order`: the order in which the K indices are visited (default 0..K-1); `align`: "products" or "sum"
    (FAST_ACC_ALIGN); `promote_every`: keys per reduced-precision partial sum, the partial sums added exactly
    (FAST_ACC_PROMOTE_EVERY; None: never promoted); returns float32.
    """
    if align not in ("products", "sum"):
        raise ValueError(f"align={align!r}; valid: products, sum")
    if order is not None:
        a, b = a.index_select(-1, order), b.index_select(-2, order)
    k = a.shape[-1]
    acc = torch.zeros(*a.shape[:-1], b.shape[-1], dtype=torch.float64, device=a.device)
    total = torch.zeros_like(acc)
    for start in range(0, k, k_step):
        if promote_every and start and start % promote_every == 0:
            total, acc = total + acc, torch.zeros_like(acc)
        if align == "sum":
            part = torch.matmul(a[..., start:start + k_step].double(), b[..., start:start + k_step, :].double())
            acc = truncating_add(acc, part, bits)
            continue
        terms = a[..., start:start + k_step].double().unsqueeze(-1) * b[..., start:start + k_step, :].double().unsqueeze(-3)
        acc = aligned_sum(acc, terms, bits)
    return (total + acc).float()


def _fa3_key_order(n_keys: int, block_n: int, device) -> torch.Tensor:
    """FA3 visits key blocks from the last to the first, each block's keys in order."""
    starts = list(range(0, n_keys, block_n))[::-1]
    return torch.cat([torch.arange(s, min(s + block_n, n_keys), device=device) for s in starts])


# (mantissa bits, exponent of the smallest normal) of each FP8 format: what rounding to it keeps.
_FP8_GRID = {"e4m3": (3, -6), "e5m2": (2, -14)}


def _to_fp8_in_place(x: torch.Tensor, fmt: str, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """x (float32, non-negative, finite, within the format's range: no saturation needed) rounded to FP8 with round
    to nearest even, in place: the bits torch's cast to the FP8 dtype and back gives (checked over every float32 in
    range: tests/test_speed_bits.py), in five elementwise passes instead of a conversion and a table lookup.

    For x in [2^e, 2^(e+1)) (e at least the format's smallest normal exponent, which also covers the subnormals) the
    FP8 grid step is 2^(e-m); adding c = 2^(e+23-m) puts x where float32's own step is that, so the float32 add
    rounds x to the FP8 grid (to nearest even), and subtracting c again is exact. `scratch`: int32 room for at least
    x.numel() elements (reused across calls instead of a fresh allocation)."""
    m, emin = _FP8_GRID[fmt]
    c = None if scratch is None else scratch[:x.numel()].view(x.shape)
    c = torch.bitwise_and(x.view(torch.int32), 0x7F800000, out=c)  # x's exponent field
    c.clamp_min_((emin + 127) << 23).add_((23 - m) << 23)
    cf = c.view(torch.float32)
    return x.add_(cf).sub_(cf)


def _fa3_rows(s, v, fmt, block_n, accumulation, scratch=None, lse=False):
    """FA3's FP8 forward for scores s [.., rows, Lk] (from the FP8-rounded Q, masked, float32, contiguous;
    overwritten). Returns float32 [.., rows, Dv]; with `lse`, also each row's log-sum-exp [.., rows] (up to the
    constant 8 log 2 every split shares), what the split-KV combine weighs the splits by."""
    lk = s.shape[-1]
    full = lk // block_n
    sf = s[..., :full * block_n].unflatten(-1, (full, block_n)) if full else None
    tail = s[..., full * block_n:].unsqueeze(-2) if lk > full * block_n else None
    bmax = torch.cat([x.amax(-1) for x in (sf, tail) if x is not None], dim=-1)  # [.., rows, nb]
    # The running max when block b is visited (blocks go from the last to the first).
    run = bmax.flip(-1).cummax(-1).values.flip(-1)
    run = torch.nan_to_num(run, nan=0.0, posinf=0.0, neginf=0.0)  # a block with no visible key: 0 (one op)
    final = run[..., :1]  # the max over the whole row (the first block is visited last)
    rescale = torch.exp(run - final)  # what later max updates multiply block b's share by
    if sf is not None:  # P = exp(S - m) * 2^8 in [0, 256], in place, block by block
        sf.sub_(run[..., :full].unsqueeze(-1))
    if tail is not None:
        tail.sub_(run[..., full:].unsqueeze(-1))
    s.exp_().mul_(float(2 ** FA3_MAX_OFFSET))
    # The row sum from the unconverted P, each block's sum rescaled as the kernel does. (torch's float32 sums
    # gave the same bits under ATen's AVX2 and AVX-512 kernels and any thread count: tests/test_cpu_determinism.py.)
    block_sums = torch.cat([x.sum(-1) for x in (sf, tail) if x is not None], dim=-1)
    row_sum = (block_sums.double() * rescale.double()).sum(-1).float()
    # P to FP8 for the P·V product (scale 1; P <= 256 needs no saturation), then each block's rescale.
    _to_fp8_in_place(s, fmt, scratch)
    if sf is not None:
        sf.mul_(rescale[..., :full].unsqueeze(-1))
    if tail is not None:
        tail.mul_(rescale[..., full:].unsqueeze(-1))
    # The key order matters only to the reduced-precision accumulations; exact P.V does not build it.
    order = _fa3_key_order(lk, block_n, s.device) if accumulation != "exact" else None
    num = _pv(s, v, accumulation, order=order)
    out = num / row_sum.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1)
    if lse:
        return out, final[..., 0] + row_sum.log()
    return out


def _fa3_split_rows(s, v, fmt, block_n, accumulation, splits, scratch=None):
    """FA3's split-KV decode: each split's keys through _fa3_rows with its own running max (all splits at once, the
    last one padded with invisible keys), the splits' FP32 outputs combined by their log-sum-exps
    (hopper/flash_fwd_combine_kernel.h: scale_i = exp(lse_i - logsumexp(lse)))."""
    lk = s.shape[-1]
    ranges = split_ranges(lk, block_n, splits)
    if len(ranges) == 1:
        return _fa3_rows(s, v, fmt, block_n, accumulation, scratch)
    ns, span = len(ranges), ranges[0][1] - ranges[0][0]
    pad = ns * span - lk
    sp = torch.nn.functional.pad(s, (0, pad), value=float("-inf")).unflatten(-1, (ns, span)).transpose(-2, -3)
    vp = torch.nn.functional.pad(v, (0, 0, 0, pad)).unflatten(-2, (ns, span))  # [.., splits, keys, D]
    o, lse = _fa3_rows(sp.contiguous(), vp, fmt, block_n, accumulation, lse=True)  # [.., splits, rows, D], [.., splits, rows]
    return (torch.softmax(lse, dim=-2).unsqueeze(-1) * o).sum(-3)


def _exp_in_place(s: torch.Tensor) -> torch.Tensor:
    """exp(s - rowmax), in place (rows with no visible key stay at 0)."""
    m = torch.nan_to_num(s.amax(-1, keepdim=True), nan=0.0, posinf=0.0, neginf=0.0)
    return s.sub_(m).exp_()


def _row_sums(p: torch.Tensor) -> torch.Tensor:
    """p's sums over the last dimension [.., rows, 1]."""
    return p.sum(-1, keepdim=True)


def _unit_scale_rows(s, v, fmt, accumulation):
    probs = _exp_in_place(s)
    probs.div_(_row_sums(probs).clamp_min(torch.finfo(torch.float32).tiny))
    probs = fp8_roundtrip(probs, 1.0, fmt)
    return _pv(probs, v, accumulation)


def _exact_rows(s, v, accumulation, v_ones=None):
    """Exact attention; with `exact` accumulation the row sums come out of the same product as P·V (V with a
    column of ones appended: `v_ones`, the slice's keys of it when the caller built it once for all slices)."""
    p = _exp_in_place(s)
    if accumulation != "exact":
        return _pv(p, v, accumulation) / _row_sums(p).clamp_min(torch.finfo(torch.float32).tiny)
    if v_ones is None:
        v_ones = _with_ones(v)
    nd = torch.matmul(p, v_ones)
    return nd[..., :-1] / nd[..., -1:].clamp_min(torch.finfo(torch.float32).tiny)


def _with_ones(v: torch.Tensor) -> torch.Tensor:
    """v [.., keys, D] with a column of ones appended [.., keys, D + 1]: the view the cache keeps with v
    (V_WITH_ONES) when it is one, else a contiguous copy."""
    w = getattr(v, V_WITH_ONES, None)
    if (w is not None and w.dtype == v.dtype and w.shape == (*v.shape[:-1], v.shape[-1] + 1)
            and w.data_ptr() == v.data_ptr() and w.stride()[:-1] == v.stride()[:-1]):
        return w
    ones = torch.ones(*v.shape[:-1], 1, dtype=v.dtype, device=v.device)
    return torch.cat([v, ones], dim=-1)


def _mask_in_place(s5: torch.Tensor, mask: torch.Tensor | None, kv_heads: int, groups: int) -> None:
    """Apply a bool (True = visible) or additive mask [.., heads or 1, rows, keys] to scores s5 [B, KVH, G, rows,
    keys] (query heads grouped by the KV head they read)."""
    if mask is None:
        return
    if mask.dim() == 4:
        mask = mask.unsqueeze(2) if mask.shape[1] == 1 else mask.unflatten(1, (kv_heads, groups))
    if mask.dtype == torch.bool:
        s5.masked_fill_(~mask, float("-inf"))
    else:
        s5.add_(mask.float())


_TRIANGLES: dict = {}


def _upper_triangle(n: int, device) -> torch.Tensor:
    """[n, n] bool, True above the diagonal (the keys a slice's rows may not see among its last n), built once."""
    key = (n, str(device))
    if key not in _TRIANGLES:
        _TRIANGLES[key] = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
    return _TRIANGLES[key]


def _is_plain_causal(mask: torch.Tensor, lq: int, lk: int) -> bool:
    """Whether a bool mask [B, 1, lq, lk] lets row i see exactly the keys up to lk - lq + i (every batch row alike;
    checked whole at every call: ~0.2 ms for a 512 x 2048 mask)."""
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or tuple(mask.shape[-2:]) != (lq, lk):
        return False
    rows = torch.arange(lk - lq, lk, device=mask.device).unsqueeze(1)
    causal = torch.arange(lk, device=mask.device).unsqueeze(0) <= rows
    return torch.equal(mask, causal.expand_as(mask))


def _pv(w, v, accumulation, order=None):
    """P.V as `accumulation` says: exact, fast_fp8 (promoted every FAST_ACC_PROMOTE_EVERY keys) or fa3_unfixed (never
    promoted across the context: FA3 before the two-level fix, keys in FA3's block order)."""
    if accumulation == "fast_fp8":
        return fast_fp8_matmul(w, v, order=order)
    if accumulation == "fa3_unfixed":
        return fast_fp8_matmul(w, v, order=order, promote_every=None)
    return torch.matmul(w, v)


def _row_slices(lq: int, lk: int, rows: int, decode_n: int | None, decode_live, kv_heads: int):
    """(first row, row count, split count or None) of each slice of query rows emulated_attention works on: at most
    `rows` rows; with `decode_n` (rows that are decode steps) only rows whose keys fill the same number of decode_n
    blocks and whose steps split alike (FA3 gives every row of a slice one split count)."""
    if decode_n is None:
        for r0 in range(0, lq, rows):
            yield r0, min(rows, lq - r0), None
        return

    def blocks_and_splits(r: int) -> tuple[int, int]:
        pos = lk - lq + r  # the row's position: it sees keys 0..pos
        nb = -(-(pos + 1) // decode_n)
        return nb, fa3_num_splits(nb, kv_heads, max(1, int(decode_live[pos])))

    for (_, splits), group in itertools.groupby(range(lq), key=blocks_and_splits):
        group = list(group)
        for i in range(0, len(group), rows):
            yield group[i], min(rows, len(group) - i), splits


def emulated_attention(query, key, value, attention_mask, scaling: float, *, mode: str, accumulation: str,
                       fmt: str | None, q_scale=1.0, sliding: bool = False, decode: bool = False,
                       decode_live=None) -> torch.Tensor:
    """Attention over [B, H, L, D] tensors (K/V already as the cache holds them) with Q, P and the P·V
    accumulation treated as `mode` / `accumulation` say (`kv_only` + `exact`: exact attention, what the
    reference engine runs on CPU for every layer instead of SDPA, whose reductions follow the CPU's vector
    width and thread count). Returns [B, Lq, H, D] in query's dtype, as transformers' attention functions do.
    `decode` (kv.fa3_decode): with `fa3_fp8`, a batch of few query rows takes FA3's decode tiles and a decode step
    splits the keys, as FA3's decode path does (see FA3_DECODE_ROWS); otherwise the prefill tiles throughout.
    `decode_live` (with `decode`; a teacher-forced decode path in one pass, issue 35): every query row is a decode step
    of its own, computed as that step computes it (the decode tiles of one query token, its own split count), rows
    grouped by their count of key blocks; `decode_live[p]` is how many sequences the decode batch held at the step of
    absolute position p (FA3's dynamic split count depends on it: fa3_num_splits).

    Computed from matrix products, elementwise steps and sums whose bits do not depend on the thread count or on
    ATen's AVX2 / AVX-512 kernels (tests/test_cpu_determinism.py). Query heads that
    share a KV head are stacked as rows of one product (no per-head copy of K and V)."""
    if mode not in ATTENTION_MODES:
        raise ValueError(f"kv.attention={mode!r}; valid: {', '.join(ATTENTION_MODES)}")
    if accumulation not in ACCUMULATION_MODES:
        raise ValueError(f"kv.accumulation={accumulation!r}; valid: {', '.join(ACCUMULATION_MODES)}")
    b, h, lq, d = query.shape
    kvh, lk = key.shape[1], key.shape[2]
    groups = h // kvh
    q = fp8_roundtrip(query, q_scale, fmt) if mode != "kv_only" else query
    q, k, v = q.float(), key.float(), value.float()
    # The sdpa mask builder returns None when plain causal masking suffices: row i sees keys up to lk - lq + i. A
    # chunk after the first gets that same causal mask written out: it is recognised and treated the same way (the
    # same keys set to -inf, without a pass over every score).
    if attention_mask is not None and lq > 1 and _is_plain_causal(attention_mask, lq, lk):
        attention_mask = None
    causal = attention_mask is None and lq > 1
    # Row slices of at most _SLICE_ROWS queries: under a causal mask a slice sees only the keys up to its
    # last row, so the quadratic work is a triangle, not a square, as FA3 skips masked blocks; a slice's
    # scores stay small enough to be worked on in cache.
    rows = max(1, min(_SLICE_ROWS, _SLICE_ELEMENTS // max(1, b * h * lk)))
    # The output in the layout returned ([B, Lq, H, D]); the slices write through a permuted view of it.
    out_t = torch.empty(b, lq, kvh, groups, v.shape[-1], dtype=torch.float32, device=q.device) if lq > 1 else None
    out = out_t.permute(0, 2, 3, 1, 4) if out_t is not None else None
    # Exact attention's V with its column of ones, built once; each slice reads the rows of its keys.
    v_ones = _with_ones(v) if mode == "kv_only" and accumulation == "exact" else None
    # One room for every slice's scores (and FA3's int32 scratch) instead of fresh allocations per slice.
    room = b * kvh * groups * min(rows, lq) * lk
    s_room = torch.empty(room, dtype=torch.float32, device=q.device)
    scratch = torch.empty(room, dtype=torch.int32, device=q.device) if mode == "fa3_fp8" else None
    # FA3 picks its tiles per batch from the rows a KV head's query heads make (lq * groups): few rows, decode tiles.
    decode_n = fa3_decode_block_n(d, lq * groups, sliding) if mode == "fa3_fp8" and decode else None
    per_row = mode == "fa3_fp8" and decode and decode_live is not None and lq > 1 and not sliding
    if per_row:  # each row is one decode step: one query token's tiles
        decode_n = fa3_decode_block_n(d, groups, sliding) or fa3_block_n(d, sliding)
    for r0, n, splits in _row_slices(lq, lk, rows, decode_n if per_row else None, decode_live, kvh):
        qs = q[:, :, r0:r0 + n].reshape(b, kvh, groups * n, d)
        ks, vs, ms, end = k, v, None, lk
        if causal:
            end = lk - lq + r0 + n
            ks, vs = k[:, :, :end], v[:, :, :end]
        elif attention_mask is not None:
            ms = attention_mask[..., r0:r0 + n, :] if attention_mask.shape[-2] == lq else attention_mask
            visible = ms if ms.dtype == torch.bool else ms > float("-inf")
            seen = visible.reshape(-1, visible.shape[-1]).any(0).nonzero()
            end = int(seen[-1]) + 1 if seen.numel() else lk
            if end < lk:  # keys no row of this slice can see add exp(-inf) = 0: leave them out exactly
                ks, vs, ms = k[:, :, :end], v[:, :, :end], ms[..., :end]
        s = s_room[:b * kvh * groups * n * end].view(b, kvh, groups * n, end)
        torch.matmul(qs, ks.transpose(-1, -2), out=s).mul_(scaling)  # [B, KVH, G*n, keys]
        if causal:  # only the last n keys hold masked positions: the rows' diagonal
            s.view(b, kvh, groups, n, end)[..., end - n:].masked_fill_(_upper_triangle(n, q.device), float("-inf"))
        else:
            _mask_in_place(s.view(b, kvh, groups, n, end), ms, kvh, groups)
        if mode == "fa3_fp8" and decode and lq == 1 and not sliding:  # a decode step: FA3's decode tiles, split-KV
            bn = decode_n or fa3_block_n(d, sliding)
            live = b if decode_live is None else int(decode_live[lk - 1])
            o = _fa3_split_rows(s, vs, fmt, bn, accumulation, fa3_num_splits(-(-end // bn), kvh, live), scratch)
        elif splits is not None:  # rows that are decode steps with the same key blocks and split count
            o = _fa3_split_rows(s, vs, fmt, decode_n, accumulation, splits, scratch)
        elif mode == "fa3_fp8":
            o = _fa3_rows(s, vs, fmt, decode_n or fa3_block_n(d, sliding), accumulation, scratch)
        elif mode == "qp_unit_scale":
            o = _unit_scale_rows(s, vs, fmt, accumulation)
        else:
            o = _exact_rows(s, vs, accumulation, None if v_ones is None else v_ones[:, :, :end])
        if out is None:  # one query row (decode): [B, KVH, G, D] is already [B, 1, H, D]
            return o.view(b, 1, h, -1).to(query.dtype)
        out[:, :, :, r0:r0 + n] = o.view(b, kvh, groups, n, -1)
    return out_t.view(b, lq, h, -1).to(query.dtype)
