"""What the K and V that the cache stores look like at given scales: saturation, flush to zero,
rounding error, per layer."""

from __future__ import annotations

from dataclasses import dataclass

from fp8eval.calibrate.config import FP8_E4M3_MIN_NORMAL
from fp8eval.scales import FP8_E4M3_MAX, KVScales


def _fmt(x: float) -> str:
    return f"{x:.4g}"


@dataclass
class KVStats:
    """Per layer, per KV head, over all calibration tokens; k after rotary embedding, as cached."""

    amax: dict[str, dict[int, list[float]]]  # "k"/"v" -> layer -> [H_kv]
    n_values: dict[str, dict[int, list[int]]]
    n_saturate_at_1: dict[str, dict[int, list[int]]]  # |x| > 448: clipped by uncalibrated FP8
    n_clip_at_scale: dict[str, dict[int, list[int]]]  # |x| > 448 s: clipped at the calibrated scale
    n_subnormal_at_1: dict[str, dict[int, list[int]]]  # 0 < |x| < 2^-6: fewer mantissa bits at scale 1.0
    rel_err_at_1: dict[str, dict[int, float]]  # ||x - fp8(x)|| / ||x|| at scale 1.0, whole layer
    rel_err_at_scale: dict[str, dict[int, float]]  # the same at the calibrated scale


def collect_kv_stats(model, input_ids: list[list[int]], scales: KVScales) -> KVStats:
    """One forward per sample with a cache that records what attention stores: the keys and values as
    handed to the cache (post-rotary, post k-norm), which is what llm-compressor observes and vLLM caches."""
    import torch
    from transformers import DynamicCache

    from fp8eval.core.quant import fp8_roundtrip  # torch: not imported on a calibration cache hit

    acc: dict[str, dict[int, dict[str, torch.Tensor]]] = {"k": {}, "v": {}}
    table_of = {"k": scales.k, "v": scales.v}

    def record(which: str, layer: int, x: torch.Tensor) -> None:
        x = x.detach().float()  # [B, H_kv, T, D]
        a = x.abs()
        dims = (0, 2, 3)
        s = table_of[which][layer].to(x.device)
        limit = FP8_E4M3_MAX * (s.reshape(1, -1, 1, 1) if s.ndim else s)
        new = {
            "amax": a.amax(dim=dims),
            "n": torch.full((x.shape[1],), a[:, :1].numel(), dtype=torch.float64),
            "sat": (a > FP8_E4M3_MAX).sum(dim=dims).double(),
            "clip": (a > limit).sum(dim=dims).double(),
            "sub": ((a > 0) & (a < FP8_E4M3_MIN_NORMAL)).sum(dim=dims).double(),
            "err2_1": ((x - fp8_roundtrip(x, 1.0, "e4m3")) ** 2).sum().double().reshape(1),
            "err2_s": ((x - fp8_roundtrip(x, s, "e4m3")) ** 2).sum().double().reshape(1),
            "sig2": (x**2).sum().double().reshape(1),
        }
        old = acc[which].get(layer)
        if old is None:
            acc[which][layer] = new
        else:
            old["amax"] = torch.maximum(old["amax"], new["amax"])
            for k in new:
                if k != "amax":
                    old[k] = old[k] + new[k]

    class StatsCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            record("k", layer_idx, key_states)
            record("v", layer_idx, value_states)
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    device = next(model.parameters()).device
    with torch.no_grad():
        for ids in input_ids:
            x = torch.tensor([ids], device=device)
            model(input_ids=x, past_key_values=StatsCache(config=model.config), use_cache=True)

    def table(field_name: str, cast):
        return {w: {layer: [cast(v) for v in d[field_name].tolist()] for layer, d in sorted(acc[w].items())} for w in acc}

    def rel(err: str):
        return {w: {layer: float((d[err] / d["sig2"].clamp_min(1e-30)).sqrt()) for layer, d in sorted(acc[w].items())}
                for w in acc}

    return KVStats(
        amax=table("amax", float),
        n_values=table("n", int),
        n_saturate_at_1=table("sat", int),
        n_clip_at_scale=table("clip", int),
        n_subnormal_at_1=table("sub", int),
        rel_err_at_1=rel("err2_1"),
        rel_err_at_scale=rel("err2_s"),
    )


def collect_kv_stats_unquantized(model, input_ids: list[list[int]], scales: KVScales) -> KVStats:
    """After one-shot the attention modules fake-quantize K/V in their forward; switched off here, the
    statistics are those of the unquantized model (what the BF16 baseline caches)."""
    from llmcompressor.utils.helpers import DisableQuantization

    with DisableQuantization(model):
        return collect_kv_stats(model, input_ids, scales)


# --- llm-compressor ---------------------------------------------------------------------------------------


def risk_summary(stats: KVStats) -> list[str]:
    lines = []
    for which, name in (("k", "K"), ("v", "V")):
        n = sum(sum(v) for v in stats.n_values[which].values())
        sat = sum(sum(v) for v in stats.n_saturate_at_1[which].values())
        clip = sum(sum(v) for v in stats.n_clip_at_scale[which].values())
        sub = sum(sum(v) for v in stats.n_subnormal_at_1[which].values())
        amax = max(max(v) for v in stats.amax[which].values())
        worst = max(stats.rel_err_at_1[which].items(), key=lambda kv: kv[1])
        worst_s = max(stats.rel_err_at_scale[which].items(), key=lambda kv: kv[1])
        sat_layers = sorted(layer for layer, v in stats.n_saturate_at_1[which].items() if sum(v))
        lines.append(
            f"- **{name}**: max |{name.lower()}| = {_fmt(amax)} over {n:,} values. At scale 1.0: "
            f"{sat:,} ({_fmt(100 * sat / n)}%) saturate (|x| > 448)"
            + (f" in layers {sat_layers}" if sat_layers else "")
            + f", {_fmt(100 * sub / n)}% are subnormal (< 2^-6, fewer than 3 mantissa bits), worst layer "
            f"round-trip error {_fmt(100 * worst[1])}% (layer {worst[0]}). At the calibrated scales: {clip:,} "
            f"({_fmt(100 * clip / n)}%) clip, worst layer error {_fmt(100 * worst_s[1])}% (layer {worst_s[0]})."
        )
    any_sat = any(sum(v) for w in ("k", "v") for v in stats.n_saturate_at_1[w].values())
    any_clip = any(sum(v) for w in ("k", "v") for v in stats.n_clip_at_scale[w].values())
    if any_sat:
        lines.append("- **Verdict: uncalibrated FP8 (scale 1.0) clips real values of this model: calibrate.**")
    elif any_clip:
        lines.append(
            "- **Verdict: nothing saturates at scale 1.0, but these calibrated scales clip the largest "
            "values** (a moving-average observer sits below the maximum). Calibrated and uncalibrated FP8 "
            "trade range for precision differently here; only an evaluation says which is better "
            "(`calib.observer=static_minmax` gives scales that clip nothing seen in calibration)."
        )
    else:
        lines.append(
            "- **Verdict: nothing saturates at scale 1.0 and nothing clips at the calibrated scales**; "
            "calibration can still help where many values are subnormal at scale 1.0 (small amax)."
        )
    return lines
