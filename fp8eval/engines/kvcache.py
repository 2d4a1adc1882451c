"""The emulated KV cache of the reference engine, applied inside attention.

transformers hands every attention call the layer's K and V as the cache returns them: the cached
positions followed by the new ones (the last `query length` positions; in prefill, all of them). The new
positions are rounded through the cache format *in place*: the tensor is the cache's own storage (or a view
of it), so the cache then holds exactly what vLLM's FP8 cache holds, and each value is rounded once. This
relies only on the attention-function registry, not on the cache classes, whose arguments were renamed
between transformers releases. `incremental=False` re-rounds everything at every call instead (the round
trip is idempotent for a fixed scale); the tests check both give identical logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fp8eval.core.quant import KV_CACHE_DTYPE_FORMAT, fp8_roundtrip
from fp8eval.engines import kv_formats_emulation as formats
from fp8eval.engines.attention_emulation import emulated_attention

ATTENTION_NAME = "fp8eval_kv"


@dataclass
class KVPolicy:
    """What one arm stores in its cache."""

    cache_dtype: str  # vLLM's kv_cache_dtype: auto | fp8 | fp8_e4m3 | fp8_e5m2
    model_dtype: torch.dtype = torch.bfloat16  # what "auto" stores: the model's dtype
    skip_layers: tuple[str, ...] = ()  # layer indices as strings, or attention types ("sliding_window")
    k_scales: dict[int, torch.Tensor] = field(default_factory=dict)  # absent layer -> 1.0
    v_scales: dict[int, torch.Tensor] = field(default_factory=dict)
    quantize_attention: bool = False  # legacy spelling of attention="qp_unit_scale"
    q_scale: float = 1.0
    attention: str = "kv_only"  # kv_only | fa3_fp8 | qp_unit_scale (fp8eval/engines/attention_emulation.py)
    accumulation: str = "exact"  # exact | fast_fp8 | fa3_unfixed
    int8_rounding: str = "half_away"  # int8_per_token_head: half_away | trunc
    int4_rht: bool = True  # int4_per_token_head: rotate first (current kernel) or not (an earlier one)
    fa3_decode: bool = False  # fa3_fp8: FA3's decode path (tiles, split-KV) in decode steps (issue 35)
    # Set only while a probe computes a teacher-forced decode path in one pass (Probe.decode_hidden): every query row is
    # a decode step, decode_live[p] the sequences in the decode batch at position p's step (attention_emulation).
    decode_live: tuple[int, ...] | None = None

    @property
    def attention_mode(self) -> str:
        """The attention emulation in effect: `attention`, except that the legacy quantize_attention flag turns kv_only
        into qp_unit_scale."""
        return "qp_unit_scale" if self.quantize_attention and self.attention == "kv_only" else self.attention

    def emulates_kernel(self, module) -> bool:
        """Whether this layer's attention runs the emulated FP8 kernel instead of exact SDPA."""
        return self.layer_is_fp8(module) and (self.attention_mode != "kv_only" or self.accumulation != "exact")

    @property
    def fmt(self) -> str | None:
        """The FP8 format of the cache dtype (e4m3 or e5m2), or None when the cache is not FP8."""
        return KV_CACHE_DTYPE_FORMAT.get(self.cache_dtype)

    def layer_is_fp8(self, module) -> bool:
        """Whether this attention layer's cache is FP8: the cache dtype is FP8 and neither the layer index nor its
        sliding-window type is in skip_layers."""
        return self.fmt is not None and not self._skipped(module)

    def layer_format(self, module) -> str | None:
        """The other vLLM format (fp8eval.engines.kv_formats_emulation.EMULATED) this layer's cache stores, or None
        (FP8 per tensor, the model dtype, or a skipped layer)."""
        if self.cache_dtype in formats.EMULATED and not self._skipped(module):
            return self.cache_dtype
        return None

    def _skipped(self, module) -> bool:
        idx = getattr(module, "layer_idx", None)
        if idx is not None and str(idx) in self.skip_layers:
            return True
        return "sliding_window" in self.skip_layers and _is_sliding(module)

    incremental: bool = True

    def store(self, module, key: torch.Tensor, value: torch.Tensor, n_new: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Round the new K/V positions in place to what the cache stores (FP8 with the layer's scales, else the model
        dtype); returns key and value. Without `incremental`, every position is rounded again."""
        total = key.shape[-2]
        n = total if not self.incremental else min(n_new, total)
        if self.layer_format(module):
            return self._store_format(module, key, value, n, n_new)
        if not self.layer_is_fp8(module):
            # The cache holds the model dtype; rounding to it makes a float32 CPU run store what a
            # bfloat16 vLLM cache stores.
            round_k = lambda x: x.to(self.model_dtype).to(x.dtype)  # noqa: E731
            round_v = round_k
        else:
            idx = module.layer_idx
            k_scale, v_scale = self.k_scales.get(idx, 1.0), self.v_scales.get(idx, 1.0)
            round_k = lambda x: fp8_roundtrip(x, k_scale, self.fmt)  # noqa: E731
            round_v = lambda x: fp8_roundtrip(x, v_scale, self.fmt)  # noqa: E731
        if key.dtype == self.model_dtype and not self.layer_is_fp8(module):
            return key, value
        k_new = key.narrow(-2, total - n, n)
        v_new = value.narrow(-2, total - n, n)
        k_new.copy_(round_k(k_new))
        v_new.copy_(round_v(v_new))
        return key, value


    def _store_format(self, module, key, value, n: int, n_new: int):
        """Round the new positions through one of vLLM's other formats; for TurboQuant, the first prefill chunk and any later
        one of more than TQ_CHUNK_RAW_ABOVE tokens attend to their own raw K/V (the cache keeps the quantized ones):
        only chunks of at most 128 tokens after the first, and decode, read their own tokens back from the cache."""
        round_k, round_v = formats.roundtrips(self.cache_dtype, int8_rounding=self.int8_rounding,
                                              int4_rht=self.int4_rht)
        total = key.shape[-2]
        k_new, v_new = key.narrow(-2, total - n, n), value.narrow(-2, total - n, n)
        raw = None
        decode_rows = self.decode_live is not None  # a one-pass decode path: every row reads the cache, as decode does
        if (self.cache_dtype.startswith("turboquant_") and not decode_rows
                and (n_new >= total or n_new > formats.TQ_CHUNK_RAW_ABOVE)):
            raw = (k_new.clone(), v_new.clone())
        k_new.copy_(round_k(k_new))
        v_new.copy_(round_v(v_new))
        if raw is None:
            return key, value
        k_att, v_att = key.clone(), value.clone()
        k_att.narrow(-2, total - n, n).copy_(raw[0])
        v_att.narrow(-2, total - n, n).copy_(raw[1])
        return k_att, v_att


def _is_sliding(module) -> bool:
    if getattr(module, "sliding_window", None):
        return True
    cfg = getattr(module, "config", None)
    types = getattr(cfg, "layer_types", None)
    idx = getattr(module, "layer_idx", None)
    return bool(types and idx is not None and "sliding" in str(types[idx]))


# Devices whose exact (not emulated) layers run fp8eval's own attention instead of torch's SDPA. On CPU, SDPA's kernel
# sums in an order that follows the vector width and the thread count, which moved answers between machines; on CUDA
# SDPA (cuDNN, flash or memory-efficient) is fast and its order does not depend on the host.
OWN_EXACT_DEVICES = frozenset({"cpu"})


def sdpa_operands(key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V as torch's SDPA takes them on every backend: contiguous. The reserved cache hands attention a view of
    its buffers, and V's buffer carries a column of ones (row stride head_dim + 1, for the exact path's P @ [V | 1]);
    cuDNN's SDPA on CUDA rejects such a V (`mha_graph.execute(...).is_good()` on an H200, issue 34), so a view that
    is not dense is copied here. A dense one is passed as it is (no copy)."""
    return (key if key.is_contiguous() else key.contiguous(),
            value if value.is_contiguous() else value.contiguous())


def make_attention_function(policy_of):
    """An attention function for transformers' registry; `policy_of(module)` gives the active policy."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        policy: KVPolicy = policy_of(module)
        key, value = policy.store(module, key, value, n_new=query.shape[-2])
        kernel = policy.emulates_kernel(module)
        # On CPU every layer runs fp8eval's attention (exact when not emulating a kernel): OWN_EXACT_DEVICES says why.
        if kernel or query.device.type in OWN_EXACT_DEVICES:
            if scaling is None:
                scaling = query.shape[-1] ** -0.5
            out = emulated_attention(query, key, value, attention_mask, scaling,
                                     mode=policy.attention_mode if kernel else "kv_only",
                                     accumulation=policy.accumulation if kernel else "exact", fmt=policy.fmt,
                                     q_scale=policy.q_scale, sliding=_is_sliding(module),
                                     decode=policy.fa3_decode and kernel, decode_live=policy.decode_live)
            return out, None
        key, value = sdpa_operands(key, value)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)

    return attention


def register(policy_of) -> str:
    """Register the emulated-cache attention function (and SDPA's mask function) with transformers under ATTENTION_NAME
    and return that name; `policy_of(module)` gives the active KVPolicy."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, make_attention_function(policy_of))
    AttentionMaskInterface.register(ATTENTION_NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return ATTENTION_NAME
