"""The knob audit of the reference engine (its own KV policy, layer by layer) and the static checkpoint lint.

The reference engine applies what its `KVPolicy` says; the read-back lists, per attention layer of the model's
config, what that policy stores and with which scales, so the same comparison as on vLLM applies (a skip entry
that matches no layer, checkpoint scales the arm does not use, ...). The lint reads the checkpoint itself for the
traps that bite on vLLM (fp8eval.knobaudit.corpus): scale tensors vLLM's loader maps to no parameter, a declared
FP8 KV scheme under `kv_cache_dtype: auto`, per-head scales (applied by FLASH_ATTN only).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from fp8eval.core.kvformats import REFERENCE_EMULATED as EMULATED
from fp8eval.engines.audit.compare import Request

# vLLM's cache-scale name mapping (QuantizationConfig.get_cache_scale_mapper, vLLM 0.26-0.32): checkpoint names it
# turns into `<...>.self_attn.attn.{k,v,q}_scale`; anything else holding a scale is not a parameter of the model.
_VLLM_MAPS = (
    (re.compile(r"\.kv_scale$"), ".attn.k_scale"),
    (re.compile(r"\.self_attn\.[kv]_proj\.([kv])_scale$"), r".self_attn.attn.\1_scale"),
    (re.compile(r"\.self_attn\.qk(?:qk)?v_proj\.([kv])_scale$"), r".self_attn.attn.\1_scale"),
    (re.compile(r"\.self_attn\.([kv])_cache\.scale$"), r".self_attn.attn.\1_scale"),
    (re.compile(r"(?<!\.attn)\.([qkv])_scale$"), r".attn.\1_scale"),
)
_VLLM_PARAM = re.compile(r"(?:^|\.)layers\.\d+\.(?:self_attn|mixer)\.attn\.[qkv]_scale$")
_SCALE_NAME = re.compile(r"(?:[qkv]_scale|kv_scale|output_scale|_cache\.scale)$")
_TYPES = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def vllm_scale_target(name: str) -> str | None:
    """The vLLM parameter a checkpoint scale tensor loads into, or None when vLLM's mapping leads nowhere."""
    if _VLLM_PARAM.search(name):
        return name
    for pattern, repl in _VLLM_MAPS:
        if pattern.search(name):
            mapped = pattern.sub(repl, name)
            return mapped if _VLLM_PARAM.search(mapped) else None
    return None


def _config(model_dir: str | Path) -> dict:
    try:
        return json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def _tensor_names(model_dir: str | Path) -> list[str]:
    names: list[str] = []
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        try:
            from safetensors import safe_open

            with safe_open(str(f), framework="pt") as h:
                names.extend(h.keys())
        except Exception:  # noqa: BLE001 - an unreadable shard: nothing to lint in it
            continue
    return names


def lint_checkpoint(model_dir: str | Path | None, request: Request) -> list[dict]:
    """Problems a checkpoint would cause on vLLM, found by reading it: [{category, layer, asked, got}]."""
    if not model_dir or not Path(str(model_dir)).is_dir():
        return []
    out = []
    cfg = _config(model_dir)
    qc = cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config") or {}
    declared = qc.get("kv_cache_scheme") or qc.get("kv_cache_quant_algo")
    if declared and request.kv_cache_dtype == "auto":
        out.append({"category": "dtype", "layer": "config.json",
                    "asked": "kv_cache_dtype auto (meant as the model dtype)",
                    "got": f"a declared FP8 KV scheme {json.dumps(declared, sort_keys=True)[:80]}, which vLLM's auto "
                           "follows (PR #29980): ask for bfloat16 or fp8 explicitly"})
    if request.fp8:
        for name in _tensor_names(model_dir):
            if _SCALE_NAME.search(name) and ("attn" in name or "_proj" in name) and vllm_scale_target(name) is None:
                out.append({"category": "scales", "layer": name, "asked": "a KV scale vLLM loads",
                            "got": "a name vLLM's loader maps to no parameter (vLLM 0.32 refuses to start; older "
                                   "loaders dropped such names and ran at 1.0, vLLM #25047)"})
    return out


def _text(cfg: dict) -> dict:
    return cfg.get("text_config") or cfg


def config_layers(model_dir: str | Path) -> list[dict]:
    """Attention layers of a model config: index, sliding window, the layer whose cache it reads (KV sharing)."""
    t = _text(_config(model_dir))
    n = int(t.get("num_hidden_layers") or 0)
    types = t.get("layer_types") or []
    shared = int(t.get("num_kv_shared_layers") or 0)
    first_shared = n - shared
    rows = []
    for i in range(n):
        kind = types[i] if i < len(types) else ("sliding_attention" if t.get("sliding_window") and
                                                 t.get("use_sliding_window") else "full_attention")
        if "linear" in kind or "mamba" in kind:
            continue  # no KV cache of this kind
        sliding = t.get("sliding_window") if "sliding" in kind else None
        target = None
        if shared and i >= first_shared:  # reads the last earlier layer of its own type (Gemma 3n / Gemma 4)
            same = [j for j in range(first_shared) if (types[j] if j < len(types) else kind) == kind]
            target = f"model.layers.{same[-1]}" if same else None
        rows.append({"index": i, "name": f"model.layers.{i}", "sliding_window": sliding, "kv_sharing_target": target})
    return rows


def readback(policy, model_dir: str | Path, backend: str) -> dict:
    """What a reference-engine KVPolicy stores per attention layer of the model at `model_dir`."""
    rows = []
    for layer in config_layers(model_dir):
        idx = layer["index"]
        skipped = str(idx) in policy.skip_layers or ("sliding_window" in policy.skip_layers and layer["sliding_window"])
        fp8 = policy.fmt is not None and not skipped
        # the other emulated formats (per-token-head INT8/INT4, TurboQuant, NVFP4) by name, as vLLM reports them
        emulated = policy.cache_dtype in EMULATED and not skipped
        model_dtype = str(policy.model_dtype).removeprefix("torch.")
        row = dict(layer, kv_cache_dtype=policy.cache_dtype if fp8 or emulated else "auto",
                   torch_dtype=_TYPES.get(policy.cache_dtype, model_dtype) if fp8 else model_dtype, backend=backend)
        for key, table in (("k_scale", policy.k_scales), ("v_scale", policy.v_scales)):
            value = table.get(idx, 1.0)
            row[key] = [float(x) for x in value.reshape(-1).tolist()] if hasattr(value, "reshape") else [float(value)]
        row["q_scale"] = [float(policy.q_scale)]
        rows.append(row)
    return {"source": "reference engine (its KV policy over the model config's layers)", "layers": rows}
