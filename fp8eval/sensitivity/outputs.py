"""What a sensitivity run writes into its run dir: sensitivity.json, sensitivity.md, the heatmap
(layer x position bucket) and the recommended kv option, both beside them and where `hydra.searchpath`
finds it."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

from fp8eval.core.paths import display_path
from fp8eval.core.secrets import redact, redact_obj
from fp8eval.sensitivity.ranking import skip_layer_strings

KV_FILE = "kv_skip_recommended.yaml"
KV_OPTION = "skip_recommended"  # conf/kv/<this>.yaml under the run dir, for `hydra.searchpath`


def kv_option_yaml(result: dict, kv) -> str:
    """A kv option like conf/kv/*.yaml: the arm's settings with the recommended layers kept in BF16."""
    from omegaconf import OmegaConf

    args = dict(OmegaConf.to_container(OmegaConf.create(dict(kv.engine_args)), resolve=True))
    args["kv_cache_dtype_skip_layers"] = skip_layer_strings(result["recommended_skip_layers"])
    node = {"defaults": ["/schema/kv/kv@_here_", "_self_"], "name": f"{kv.name}_{KV_OPTION}",
            "description": (f"{kv.description or kv.name}; layers {result['recommended_skip_layers']} kept in BF16 "
                            f"(fp8eval.sensitivity on {result['model']}: removes {100 * result['removed_share']:.0f}% "
                            f"of the full-FP8 divergence, KV bytes {result['kv_bytes_ratio']:.3f} of BF16)")}
    if kv.scales:
        node["scales"] = kv.scales
        node["scale_strategy"] = kv.scale_strategy
    if kv.quantize_attention:
        node["quantize_attention"] = True
    node["engine_args"] = args
    head = (f"# Written by `python -m fp8eval.sensitivity model={result['model']} kv={kv.name}`.\n"
            f"# Use it: python -m fp8eval model={result['model']} hydra.searchpath=[file://<this run dir>/conf] "
            f"kv={KV_OPTION}\n")
    return head + OmegaConf.to_yaml(OmegaConf.create(node))


def next_commands(result: dict, run_dir: Path) -> list[str]:
    """The two commands that evaluate the recommended skip list: with the skip layers on the command line, and with the
    kv option written into the run dir."""
    skip = ",".join(skip_layer_strings(result["recommended_skip_layers"]))
    model, kv = result["model"], result["kv"]
    return [
        # kv.name labels the arm in tables and reports (the skip list alone would still read "fp8").
        f"python -m fp8eval model={model} kv={kv} kv.name={kv}_{KV_OPTION} "
        + shlex.quote(f"kv.engine_args.kv_cache_dtype_skip_layers=[{skip}]"),
        # Relative to the working directory, as every printed run dir (Hydra resolves it from there too).
        f"python -m fp8eval model={model} hydra.searchpath=[file://{display_path(run_dir / 'conf')}] kv={KV_OPTION}",
    ]


def write(run_dir: Path, result: dict, kv) -> list[Path]:
    """Write sensitivity.json, the recommended kv option (beside them and under conf/kv/), the heatmap (when matplotlib
    is there) and sensitivity.md; returns the paths written."""
    run_dir.mkdir(parents=True, exist_ok=True)
    result = dict(result, next_commands=next_commands(result, run_dir), kv_option=display_path(run_dir / KV_FILE))
    text = kv_option_yaml(result, kv)
    (run_dir / KV_FILE).write_text(text, encoding="utf-8")
    option = run_dir / "conf" / "kv" / f"{KV_OPTION}.yaml"
    option.parent.mkdir(parents=True, exist_ok=True)
    option.write_text(text, encoding="utf-8")
    (run_dir / "sensitivity.json").write_text(json.dumps(redact_obj(_finite(result)), indent=1) + "\n", encoding="utf-8")
    written = [run_dir / "sensitivity.json", run_dir / KV_FILE, option]
    try:
        heatmap(run_dir / "sensitivity_heatmap.png", result)
        written.append(run_dir / "sensitivity_heatmap.png")
    except ImportError as e:  # matplotlib is the `report` extra
        print(f"sensitivity: heatmap not drawn ({e}); pip install 'fp8eval[report]'")
    (run_dir / "sensitivity.md").write_text(redact(markdown(result)), encoding="utf-8")
    written.append(run_dir / "sensitivity.md")
    return written


def _finite(obj):
    """NaN (a bucket with no tokens, a layer without statistics) becomes null: valid JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def heatmap(path: Path, result: dict) -> None:
    """Draw the layer x position-bucket heatmap of KL(bf16 || only this layer FP8) to `path` (log colour scale;
    recommended layers starred)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import LogNorm

    layers = result["layers"]
    buckets = list(result["full_fp8"]["buckets"])
    grid = np.array([[d["kl_only_this_by_bucket"].get(b, np.nan) for b in buckets] for d in layers], dtype=float)
    positive = grid[np.isfinite(grid) & (grid > 0)]
    fig, ax = plt.subplots(figsize=(2.2 + 1.1 * len(buckets), 1.2 + 0.28 * len(layers)))
    norm = LogNorm(vmin=positive.min(), vmax=positive.max()) if positive.size else None
    im = ax.imshow(np.where(grid > 0, grid, np.nan), aspect="auto", cmap="magma_r", norm=norm)
    ax.set_xticks(range(len(buckets)), buckets)
    rec = set(result["recommended_skip_layers"])
    ax.set_yticks(range(len(layers)), [f"{d['index']}{' sw' if 'sliding' in d['attention_type'] else ''}"
                                       f"{' *' if d['index'] in rec else ''}" for d in layers], fontsize=7)
    ax.set_xlabel("token position")
    ax.set_ylabel("layer (sw = sliding window, * = recommended BF16)")
    fig.colorbar(im, ax=ax, label="KL(bf16 || only this layer FP8), mean per token")
    ax.set_title(f"{result['model']}, kv={result['kv']}: per-layer sensitivity", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _g(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3g}"


def markdown(result: dict) -> str:
    """The text of sensitivity.md: summary of full FP8 and the recommended skip list, the commands to evaluate it, and
    the ranked per-layer table."""
    r = result
    rows = []
    by_index = {d["index"]: d for d in r["layers"]}
    for rank_pos, i in enumerate(r["ranking"], 1):
        d = by_index[i]
        rows.append(f"| {rank_pos} | {i} | {d['attention_type']} | {_g(d['kl_only_this'])} | {_g(d['kl_all_but_this'])} "
                    f"| {_g(d['top1_only_this'])} | {_g(d['k_amax'])} | {_g(d['v_amax'])} | {_g(d['sat_rate'])} "
                    f"| {_g(d['ftz_rate'])} | {_g(d.get('rel_err'))} | {'yes' if i in r['recommended_skip_layers'] else ''} |")
    sw = r.get("sliding_window")
    passages = ", ".join(f"{p['book'].removesuffix('.txt')} ({p['length']} tokens)" for p in r["passages"])
    lines = [
        f"# Which layers should keep a BF16 KV cache? {r['model']}, kv={r['kv']}",
        "",
        f"Passages: {passages}; "
        f"{r['n_tokens']:,} positions per configuration, {r['passes']['total']} passes on the "
        f"{r['passes'].get('path', 'prefill')} path of the reference "
        f"engine (attention emulation `{r.get('attention')}`). Divergence = KL(bf16 || variant) of the next-token "
        f"distributions, mean per token, as `python -m fp8eval.divergence` measures it.",
        "",
        f"- Full FP8: KL {_g(r['kl_full_fp8'])}, top-1 agreement {_g(r['full_fp8']['overall']['top1_agree'])}; "
        f"the single-layer KLs sum to {_g(r['sum_kl_only_this'])} ({_g(r['sum_kl_only_this'] / r['kl_full_fp8'] if r['kl_full_fp8'] else None)}x).",
        f"- Recommended BF16 layers (target {r['target']:.0%} removed, ranked by {r['rank_by']}): "
        f"**{r['recommended_skip_layers']}**: KL {_g(r['kl_with_skip'])}, {r['removed_share']:.0%} removed "
        f"(predicted {r['predicted_share']:.0%}; target {'met' if r['target_met'] else 'NOT met'}), KV bytes "
        f"{r['kv_bytes_ratio']:.3f} of BF16 (full FP8 {r['kv_bytes_ratio_full_fp8']:.3f}).",
    ]
    if sw:
        lines.append(f"- Sliding window: {sw['text']}")
    lines += ["", "Evaluate it like any arm:", "", "```", *r.get("next_commands", []), "```", "",
              "![heatmap](sensitivity_heatmap.png)", "",
              "| rank | layer | attention | KL only this FP8 | KL all but this | top-1 only this | k amax | v amax "
              "| sat rate | ftz rate | mean rel err | BF16 |",
              "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|", *rows, ""]
    return "\n".join(lines)
