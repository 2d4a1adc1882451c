"""scales_report.md and scales_report.png beside a calibrated checkpoint."""

from __future__ import annotations

from pathlib import Path

from fp8eval.calibrate.data import TokenizedSet
from fp8eval.calibrate.kvstats import KVStats, _fmt, risk_summary
from fp8eval.scales import FP8_E4M3_MAX, KVScales


def write_report(out_dir: Path, scales: KVScales, stats: KVStats, key: dict, tokenized: TokenizedSet,
                 model_name: str) -> None:
    per_head = scales.strategy == "attn_head"
    rows = []
    for layer in scales.layers:
        cells = [str(layer)]
        for which, sc in (("k", scales.k), ("v", scales.v)):
            s = sc[layer].reshape(-1).tolist()
            amax = stats.amax[which].get(layer, [float("nan")])
            amax_t = max(amax)
            if per_head:
                head = [a / (FP8_E4M3_MAX * x) for a, x in zip(amax, s)]
                cells += [" ".join(_fmt(x) for x in s), _fmt(amax_t), " ".join(f"{h:.2f}" for h in head)]
            else:
                cells += [_fmt(s[0]), _fmt(amax_t), f"{amax_t / (FP8_E4M3_MAX * s[0]):.2f}"]
            cells += [str(sum(stats.n_saturate_at_1[which].get(layer, [0]))),
                      str(sum(stats.n_clip_at_scale[which].get(layer, [0]))),
                      f"{100 * stats.rel_err_at_1[which].get(layer, float('nan')):.2f}",
                      f"{100 * stats.rel_err_at_scale[which].get(layer, float('nan')):.2f}"]
        rows.append("| " + " | ".join(cells) + " |")
    scale_col = "scales (per head)" if per_head else "scale"
    header = (
        f"| layer | k {scale_col} | k amax | k amax/(448·s) | k sat@1.0 | k clip@s | k err@1.0 % | k err@s % "
        f"| v {scale_col} | v amax | v amax/(448·s) | v sat@1.0 | v clip@s | v err@1.0 % | v err@s % |\n"
        "|---:|---|---:|---|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---:|"
    )
    ds = key["dataset"]
    ds_name = ds.get("id") or ds.get("name")
    text = "\n".join([
        f"# FP8 KV scales report: {model_name}, strategy {scales.strategy}",
        "",
        f"Calibration: {len(tokenized.input_ids)} samples of `{ds_name}`"
        + (f" ({ds['split']})" if ds.get("split") else "")
        + f", {tokenized.n_tokens:,} tokens, seq_len {key['seq_len']} ({tokenized.n_truncated} samples cut to it), "
        f"seed {key['seed']}, observer `{key['observer'] or 'minmax (llm-compressor default)'}`, pipeline "
        f"`{key['pipeline']}`; llmcompressor {key['versions']['llmcompressor']}. Scales sha256 `{scales.sha256}`.",
        "",
        "A scale s stores x as fp8(x / s) and reads fp8 · s (vLLM and compressed-tensors semantics); "
        "llm-compressor sets s = amax / 448. Uncalibrated vLLM uses s = 1.0. amax is measured here over the "
        "same calibration tokens on the unquantized model, K after rotary embedding (as cached). `sat@1.0` = "
        "values with |x| > 448, which scale 1.0 clips; `clip@s` = values with |x| > 448·s, which the calibrated "
        "scale s clips; `err@…` = relative RMS error of the FP8 round trip at that scale; `amax/(448·s)` > 1 "
        "means the largest calibration values clip at the calibrated scale (a moving-average observer does "
        "that on purpose).",
        "",
        "## Summary",
        "",
        *risk_summary(stats),
        "",
        "![scales](scales_report.png)",
        "",
        "## Per layer",
        "",
        header,
        *rows,
        "",
    ])
    (out_dir / "scales_report.md").write_text(text, encoding="utf-8")
    plot_scales(out_dir / "scales_report.png", scales, stats, model_name)


def plot_scales(path: Path, scales: KVScales, stats: KVStats, model_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = scales.layers
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, which, sc in ((axes[0], "k", scales.k), (axes[1], "v", scales.v)):
        vals = [sc[layer].reshape(-1).tolist() for layer in layers]
        n_heads = len(vals[0])
        for h in range(n_heads):
            label = "calibrated scale" if n_heads == 1 else f"calibrated scale, head {h}"
            ax.plot(layers, [v[h] for v in vals], marker="o", ms=3, lw=1, label=label)
        ax.plot(layers, [max(stats.amax[which][layer]) / FP8_E4M3_MAX for layer in layers], ls="--", color="black",
                lw=1, label="measured amax / 448" + (" (max over heads)" if n_heads > 1 else ""))
        ax.axhline(1.0, color="red", lw=1, ls=":", label="uncalibrated scale 1.0")
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_title(f"{which.upper()} ({'after rotary, ' if which == 'k' else ''}as cached)")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("scale (log)")
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(f"FP8 KV scales: {model_name}, strategy {scales.strategy}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
