"""FP8 KV-cache scales: read them from a compressed-tensors checkpoint or a JSON file, hash them.

Semantics are vLLM's and compressed-tensors': a scale `s` maps a cached value `x` to `fp8(x / s)` and back
to `fp8(x / s) * s`; llm-compressor stores `s = amax / 448` (448 = largest float8_e4m3fn value), so
`s = 1.0` (uncalibrated vLLM) saturates values beyond ±448. K scales are observed on the keys as they
enter the cache, i.e. after rotary embedding (and after any k-norm); V scales on the values.

Shapes here: `[]` per layer for strategy "tensor", `[num_kv_heads]` for strategy "attn_head" (broadcast
over [B, H_kv, T, D] as `scale[None, :, None, None]`). Checkpoints store `[1]` and `[H_kv, 1, 1]`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:  # torch is imported where it is used: kv configs import this module at composition
    import torch

JSON_FORMAT = "fp8eval-kv-scales/1"
STRATEGIES = ("tensor", "attn_head")
FP8_E4M3_MAX = 448.0

# `model.layers.12.self_attn.k_scale` (compressed-tensors, what llm-compressor writes today); also the
# older `...self_attn.k_proj.output_scale` form vLLM still remaps, and `...attn.k_scale` (vLLM's own name).
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.(\d+)\.")
_KV_NAME = re.compile(r"\.(?:(k|v)_scale|(k|v)_proj\.output_scale)$")


@dataclass(frozen=True)
class KVScales:
    strategy: str  # tensor | attn_head
    k: dict[int, torch.Tensor]  # layer index -> float32 scale, shape [] or [num_kv_heads]
    v: dict[int, torch.Tensor]
    sha256: str  # of the canonical scale values (see scales_sha256), independent of the file format
    source: str  # resolved path it was read from

    @property
    def layers(self) -> list[int]:
        return sorted(self.k)

    @property
    def num_kv_heads(self) -> int | None:
        if self.strategy != "attn_head":
            return None
        return int(next(iter(self.k.values())).numel())

    def require_strategy(self, expected: str) -> "KVScales":
        """Fail when a kv config asks for one granularity and the source has the other."""
        if expected not in STRATEGIES:
            raise ValueError(f"unknown scale strategy {expected!r}; valid: {', '.join(STRATEGIES)}")
        if self.strategy != expected:
            raise ValueError(
                f"{self.source} holds {self.strategy!r} KV scales but the kv config asks for "
                f"scale_strategy={expected!r}; calibrate with calib.strategy={expected} or fix kv.scale_strategy"
            )
        return self

    def describe(self) -> dict:
        """What goes into an arm fingerprint and the report."""
        return {"source": self.source, "strategy": self.strategy, "sha256": self.sha256, "layers": len(self.k)}

    def to_json(self) -> dict:
        return {
            "format": JSON_FORMAT,
            "strategy": self.strategy,
            "k_scale": {str(i): _values(t) for i, t in sorted(self.k.items())},
            "v_scale": {str(i): _values(t) for i, t in sorted(self.v.items())},
            "sha256": self.sha256,
        }


def _values(t: "torch.Tensor") -> list[float]:
    import torch

    return [float(x) for x in t.detach().to(torch.float32).reshape(-1).tolist()]


def scales_sha256(strategy: str, k: Mapping[int, torch.Tensor], v: Mapping[int, torch.Tensor]) -> str:
    """sha256 of a canonical JSON text: strategy plus float32 values (repr round-trips exactly), so a
    checkpoint and the JSON written from it hash the same."""
    canon = {
        "strategy": strategy,
        "k": {str(i): _values(k[i]) for i in sorted(k)},
        "v": {str(i): _values(v[i]) for i in sorted(v)},
    }
    text = json.dumps(canon, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def make_kv_scales(strategy: str, k: Mapping[int, torch.Tensor], v: Mapping[int, torch.Tensor], source: str) -> KVScales:
    """Normalise shapes and dtype, validate, hash."""
    import torch

    if strategy not in STRATEGIES:
        raise ValueError(f"{source}: unknown KV scale strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    if set(k) != set(v):
        raise ValueError(f"{source}: k and v scales cover different layers: k={sorted(k)}, v={sorted(v)}")
    if not k:
        raise ValueError(f"{source}: no KV scales found")
    norm: dict[str, dict[int, torch.Tensor]] = {"k": {}, "v": {}}
    for name, src in (("k", k), ("v", v)):
        for layer, t in src.items():
            t = torch.as_tensor(t, dtype=torch.float32).detach().cpu().reshape(-1)
            if strategy == "tensor":
                if t.numel() != 1:
                    raise ValueError(f"{source}: layer {layer} {name}_scale has {t.numel()} values, strategy tensor needs 1")
                t = t.reshape(())
            if not bool(torch.all(torch.isfinite(t))) or not bool(torch.all(t > 0)):
                raise ValueError(f"{source}: layer {layer} {name}_scale must be finite and > 0, got {_values(t)}")
            norm[name][int(layer)] = t
    if strategy == "attn_head":
        sizes = {t.numel() for d in norm.values() for t in d.values()}
        if len(sizes) != 1:
            raise ValueError(f"{source}: per-head scales have different head counts across layers: {sorted(sizes)}")
    return KVScales(strategy, norm["k"], norm["v"], scales_sha256(strategy, norm["k"], norm["v"]), source)


def load_kv_scales(source: str | Path) -> KVScales:
    """Read k/v scales from a compressed-tensors checkpoint directory or a `fp8eval-kv-scales/1` JSON file."""
    path = Path(source).expanduser()
    if path.is_dir():
        return _from_checkpoint(path)
    if path.is_file() and path.suffix == ".json":
        return _from_json(path)
    if path.is_file():
        raise ValueError(f"{path}: expected a checkpoint directory or a .json scales file")
    raise FileNotFoundError(f"KV scales source {path} does not exist")


def _from_json(path: Path) -> KVScales:
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != JSON_FORMAT:
        raise ValueError(f"{path}: format is {data.get('format')!r}, expected {JSON_FORMAT!r}")
    unknown = set(data) - {"format", "strategy", "k_scale", "v_scale", "sha256", "meta"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}")

    import torch

    def table(key: str) -> dict[int, torch.Tensor]:
        raw = data.get(key)
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: {key} must map layer index -> list of scales")
        return {int(layer): torch.tensor(vals if isinstance(vals, list) else [vals]) for layer, vals in raw.items()}

    scales = make_kv_scales(data.get("strategy"), table("k_scale"), table("v_scale"), str(path.resolve()))
    recorded = data.get("sha256")
    if recorded is not None and recorded != scales.sha256:
        raise ValueError(f"{path}: recorded sha256 {recorded} does not match its scale values ({scales.sha256})")
    return scales


def _checkpoint_strategy(path: Path) -> str | None:
    config = path / "config.json"
    if not config.is_file():
        return None
    qc = json.loads(config.read_text(encoding="utf-8")).get("quantization_config") or {}
    scheme = qc.get("kv_cache_scheme") or {}
    return scheme.get("strategy")


def _from_checkpoint(path: Path) -> KVScales:
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path}: no *.safetensors files")
    found: dict[str, dict[int, torch.Tensor]] = {"k": {}, "v": {}}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                m = _KV_NAME.search(name)
                if not m:
                    continue
                layer = _LAYER.search(name)
                if layer is None:
                    raise ValueError(f"{file}: cannot find a layer index in tensor name {name!r}")
                which = m.group(1) or m.group(2)
                idx = int(layer.group(1))
                if idx in found[which]:
                    raise ValueError(f"{path}: two {which}_scale tensors for layer {idx} (second: {name})")
                found[which][idx] = f.get_tensor(name)
    if not found["k"]:
        raise ValueError(
            f"{path}: no k_scale/v_scale tensors; is this a checkpoint calibrated with a kv_cache_scheme? "
            "(python -m fp8eval.calibrate writes one)"
        )
    strategy = _checkpoint_strategy(path)
    if strategy is None:  # no kv_cache_scheme in config.json: infer from the shapes
        strategy = "tensor" if all(t.numel() == 1 for t in found["k"].values()) else "attn_head"
    return make_kv_scales(strategy, found["k"], found["v"], str(path.resolve()))


def save_kv_scales_json(scales: KVScales, path: str | Path, meta: dict | None = None) -> Path:
    path = Path(path)
    data = scales.to_json()
    if meta:
        data["meta"] = meta
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return path
