"""The vLLM worker extension that reads back what every attention layer of the live model uses.

Passed to vLLM as `worker_extension_cls` (at launch only: it changes no number, so it stays out of the arm's
engine args and fingerprint) and called through `LLM.collective_rpc("fp8eval_knob_audit")`. It runs inside
vLLM's worker process and reads the static forward context (`vllm_config.compilation_config
.static_forward_context`: layer name -> the Attention module vLLM built), i.e. exactly the objects the forward
pass uses: `kv_cache_dtype` (after the checkpoint's declared scheme and the skip list were applied),
`kv_cache_torch_dtype`, `_k_scale` / `_v_scale` / `_q_scale` / `_prob_scale` (the scale tensors the kernels get),
`attn_backend.get_name()`, `sliding_window` and `kv_sharing_target_layer_name`
(vllm/model_executor/layers/attention/attention.py, v0.26.0 and later).
"""

from __future__ import annotations

import re
from typing import Any

_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.(\d+)\.")
_SCALES = (("k_scale", "_k_scale"), ("v_scale", "_v_scale"), ("q_scale", "_q_scale"), ("prob_scale", "_prob_scale"))


def _values(t: Any) -> list[float] | None:
    if t is None:
        return None
    try:
        return [float(x) for x in t.detach().float().cpu().reshape(-1).tolist()]
    except AttributeError:
        return [float(t)]


def read_layers(forward_context: dict) -> list[dict]:
    """One dict per KV-cache-owning attention layer of a static forward context (sorted by layer index, then
    name): dtype, torch dtype, the four scales, backend, sliding window, KV sharing, head counts."""
    rows = []
    for name, layer in forward_context.items():
        if not hasattr(layer, "kv_cache_dtype"):
            continue  # Mamba / linear-attention layers hold no KV cache of this kind
        backend = getattr(layer, "attn_backend", None)
        try:
            backend_name = backend.get_name() if backend is not None else None
        except Exception:  # noqa: BLE001 - a backend class without get_name
            backend_name = getattr(backend, "__name__", str(backend))
        m = _LAYER_INDEX.search(name + ".")
        row = {
            "name": name,
            "index": int(m.group(1)) if m else None,
            "kv_cache_dtype": str(layer.kv_cache_dtype),
            "torch_dtype": str(getattr(layer, "kv_cache_torch_dtype", "")).removeprefix("torch.") or None,
            "backend": backend_name,
            "sliding_window": getattr(layer, "sliding_window", None),
            "kv_sharing_target": getattr(layer, "kv_sharing_target_layer_name", None),
            "num_kv_heads": getattr(layer, "num_kv_heads", None),
            "head_size": getattr(layer, "head_size", None),
            "attn_type": str(getattr(layer, "attn_type", "")) or None,
        }
        for key, attr in _SCALES:
            row[key] = _values(getattr(layer, attr, None))
        rows.append(row)
    rows.sort(key=lambda r: (r["index"] if r["index"] is not None else 1 << 30, r["name"]))
    return rows


class KnobAuditExtension:
    """Mixed into vLLM's worker class by `worker_extension_cls`; `self` is the worker."""

    def fp8eval_knob_audit(self) -> dict:
        """The read-back of every attention layer on this worker (see `read_layers`)."""
        config = getattr(self, "vllm_config", None)
        if config is None:
            config = self.model_runner.vllm_config
        layers = read_layers(config.compilation_config.static_forward_context)
        return {"source": "vllm worker (static forward context)", "layers": layers,
                "cache_config_dtype": str(config.cache_config.cache_dtype)}
