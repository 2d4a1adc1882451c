"""Per layer and per KV head: what the FP8 cache would do to the K and V it is handed.

Measured in the BF16 arm's prefill on the values the cache receives (K after rotary embedding and any
k-norm, as vLLM caches them), at the arm's format and scales (`kv.scales`, else vLLM's uncalibrated 1.0):
- amax: the largest |x|;
- saturation: |x / s| above the format's largest finite value (448 e4m3, 57344 e5m2): clamped;
- flush to zero: x != 0 whose FP8 value is 0 (|x / s| at or below half the smallest subnormal);
- subnormal: x stored as a nonzero subnormal (|q / s| below the smallest normal; fewer mantissa bits);
- mean relative rounding error: mean of |x - q(x)| / |x| over the nonzero values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from fp8eval.core.quant import FP8_MAX, fp8_roundtrip
from fp8eval.engines.kvcache import KVPolicy

# Smallest normal value of each format: below it a value keeps fewer mantissa bits.
FP8_MIN_NORMAL = {"e4m3": 2.0**-6, "e5m2": 2.0**-14}
_FIELDS = ("n", "nonzero", "sat", "ftz", "sub", "rel_err_sum")


def _head_scale(scale, n_heads: int, device) -> torch.Tensor:
    s = torch.as_tensor(scale, dtype=torch.float32, device=device).reshape(-1)
    return s.expand(n_heads) if s.numel() == 1 else s


def head_counts(x: torch.Tensor, scale, fmt: str) -> dict[str, torch.Tensor]:
    """Counts per KV head of x ([B, H, T, D]) at a scale (a float, [] or [H]) in format fmt."""
    x = x.detach().float()
    h = x.shape[1]
    s = _head_scale(scale, h, x.device)
    q = fp8_roundtrip(x, s, fmt, head_dim=1)
    scaled = (x / s.reshape(1, h, 1, 1)).abs()
    qs = (q / s.reshape(1, h, 1, 1)).abs()
    nz = x != 0
    dims = (0, 2, 3)
    rel = torch.where(nz, (x - q).abs() / x.abs().clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(x))
    return {
        "amax": x.abs().amax(dim=dims),
        "n": torch.full((h,), x[:, :1].numel(), dtype=torch.float64),
        "nonzero": nz.sum(dim=dims).double(),
        "sat": (scaled > FP8_MAX[fmt]).sum(dim=dims).double(),
        "ftz": (nz & (q == 0)).sum(dim=dims).double(),
        "sub": ((qs > 0) & (qs < FP8_MIN_NORMAL[fmt])).sum(dim=dims).double(),
        "rel_err_sum": rel.sum(dim=dims).double(),
    }


@dataclass
class KVStatsAccumulator:
    """Running per-head counts per (which, layer); `which` is "k" or "v"."""

    fmt: str
    acc: dict[tuple[str, int], dict[str, torch.Tensor]] = field(default_factory=dict)
    head_dim: dict[int, int] = field(default_factory=dict)  # layer -> D (for the KV bytes per token)
    n_heads: dict[int, int] = field(default_factory=dict)

    def add(self, which: str, layer: int, x: torch.Tensor, scale) -> None:
        """Add the per-head counts of one K or V tensor of `layer` at `scale` (amax is the running maximum, the other
        counts sum)."""
        new = head_counts(x, scale, self.fmt)
        self.head_dim[layer], self.n_heads[layer] = int(x.shape[-1]), int(x.shape[1])
        old = self.acc.get((which, layer))
        if old is None:
            self.acc[(which, layer)] = new
            return
        old["amax"] = torch.maximum(old["amax"], new["amax"])
        for k in _FIELDS:
            old[k] = old[k] + new[k]

    def merge(self, other: "KVStatsAccumulator") -> None:
        """Add another accumulator's counts (one passage's) to these: amax the maximum, the rest summed."""
        self.head_dim.update(other.head_dim)
        self.n_heads.update(other.n_heads)
        for key, new in other.acc.items():
            old = self.acc.get(key)
            if old is None:
                self.acc[key] = {k: v.clone() for k, v in new.items()}
                continue
            old["amax"] = torch.maximum(old["amax"], new["amax"])
            for k in _FIELDS:
                old[k] = old[k] + new[k]

    def to_arrays(self, prefix: str = "kv") -> dict:
        """The counts as named numpy arrays (for a passage's results file); `from_arrays` reads them back."""
        out = {}
        for (which, layer), d in self.acc.items():
            for k, v in d.items():
                out[f"{prefix}|{which}|{layer}|{k}"] = v.cpu().numpy()
            out[f"{prefix}|shape|{layer}"] = np.array([self.head_dim[layer], self.n_heads[layer]])
        return out

    @classmethod
    def from_arrays(cls, arrays: dict, fmt: str, prefix: str = "kv") -> "KVStatsAccumulator":
        """An accumulator from `to_arrays`' output (other keys ignored)."""
        out = cls(fmt=fmt)
        for name, v in arrays.items():
            parts = name.split("|")
            if parts[0] != prefix:
                continue
            if parts[1] == "shape":
                out.head_dim[int(parts[2])], out.n_heads[int(parts[2])] = int(v[0]), int(v[1])
            else:
                out.acc.setdefault((parts[1], int(parts[2])), {})[parts[3]] = torch.from_numpy(np.array(v))
        return out

    def layer_stats(self, layer: int) -> dict:
        """The per-layer fields of sensitivity.json, K and V pooled for the rates, and per head."""
        out: dict = {}
        pooled = {k: 0.0 for k in _FIELDS}
        for which in ("k", "v"):
            d = self.acc.get((which, layer))
            if d is None:
                continue
            out[f"{which}_amax"] = float(d["amax"].max())
            nonzero = float(d["nonzero"].sum())
            out[f"{which}_sat_rate"] = float(d["sat"].sum() / d["n"].sum())
            out[f"{which}_ftz_rate"] = float(d["ftz"].sum() / max(nonzero, 1.0))
            out[f"{which}_subnormal_rate"] = float(d["sub"].sum() / d["n"].sum())
            out[f"{which}_rel_err"] = float(d["rel_err_sum"].sum() / max(nonzero, 1.0))
            out[f"{which}_heads"] = {
                "amax": [float(a) for a in d["amax"]],
                "sat_rate": [float(a / n) for a, n in zip(d["sat"], d["n"])],
                "ftz_rate": [float(a / max(float(n), 1.0)) for a, n in zip(d["ftz"], d["nonzero"])],
                "subnormal_rate": [float(a / n) for a, n in zip(d["sub"], d["n"])],
                "rel_err": [float(a / max(float(n), 1.0)) for a, n in zip(d["rel_err_sum"], d["nonzero"])],
            }
            for k in _FIELDS:
                pooled[k] += float(d[k].sum())
        if pooled["n"]:
            out["sat_rate"] = pooled["sat"] / pooled["n"]
            out["ftz_rate"] = pooled["ftz"] / max(pooled["nonzero"], 1.0)
            out["subnormal_rate"] = pooled["sub"] / pooled["n"]
            out["rel_err"] = pooled["rel_err_sum"] / max(pooled["nonzero"], 1.0)
        return out

    def kv_values_per_token(self, layer: int) -> int:
        """K and V values one token occupies in this layer's cache (2 x heads x head_dim)."""
        return 2 * self.n_heads.get(layer, 0) * self.head_dim.get(layer, 0)


def recording_policy(base: KVPolicy, arm: KVPolicy, stats: KVStatsAccumulator) -> KVPolicy:
    """`base` (the BF16 arm's policy) that also records, per layer, the K/V it stores at `arm`'s format
    and scales. A subclass of KVPolicy, so the reference engine's attention hook needs no change."""

    class Recording(type(base)):
        def store(self, module, key, value, n_new):
            layer = int(module.layer_idx)
            total = key.shape[-2]
            n = min(n_new, total)
            # What a BF16 engine hands its cache: the new positions in the model dtype.
            k = key.narrow(-2, total - n, n).to(self.model_dtype)
            v = value.narrow(-2, total - n, n).to(self.model_dtype)
            stats.add("k", layer, k, arm.k_scales.get(layer, 1.0))
            stats.add("v", layer, v, arm.v_scales.get(layer, 1.0))
            return super().store(module, key, value, n_new)

    return Recording(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
