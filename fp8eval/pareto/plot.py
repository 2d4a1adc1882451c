"""pareto.png: KV bytes per token vs divergence (and, where measured, recovery CI lower bound vs ITL slope)."""

from __future__ import annotations

from pathlib import Path


def plot_pareto(result: dict, path: Path) -> None:
    """Scatter of every measured point, the frontier joined and marked, the pick circled; a second panel with the
    recovery CI lower bound against the ITL slope when the survivors have both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [p for p in result["points"] if p.get("kl") is not None]
    rec = [p for p in pts if (p.get("recovery") or {}).get("ci_low") is not None
           and (p.get("perf") or {}).get("itl_slope_ms_per_token") is not None]
    fig, axes = plt.subplots(1, 2 if rec else 1, figsize=(13 if rec else 8, 5.5), squeeze=False)
    ax = axes[0][0]
    fams = sorted({p["family"] for p in pts})
    cmap = plt.get_cmap("tab10")
    for i, fam in enumerate(fams):
        sel = [p for p in pts if p["family"] == fam]
        ax.scatter([p["kv_bytes_per_token"] for p in sel], [max(p["kl"], 1e-12) for p in sel], color=cmap(i),
                   label=fam, s=36, zorder=3)
    for p in pts:
        ax.annotate(p["key"].split("|scales")[0], (p["kv_bytes_per_token"], max(p["kl"], 1e-12)), fontsize=6,
                    xytext=(3, 3), textcoords="offset points")
    front = [p for k in result["frontier"] for p in pts if p["key"] == k]
    if front:
        ax.plot([p["kv_bytes_per_token"] for p in front], [max(p["kl"], 1e-12) for p in front], "k--", lw=1,
                label="frontier", zorder=2)
    pick = next((p for p in pts if p["key"] == result.get("pick")), None)
    if pick:
        ax.scatter([pick["kv_bytes_per_token"]], [max(pick["kl"], 1e-12)], s=220, facecolors="none",
                   edgecolors="red", lw=2, label="pick", zorder=4)
    if result["target"].get("max_kl") is not None:
        ax.axhline(result["target"]["max_kl"], color="red", lw=0.8, ls=":", label="max_kl")
    ax.axvline(result["bf16_kv_bytes_per_token"], color="grey", lw=0.8, ls=":", label="BF16")
    ax.set_yscale("log")
    ax.set_xlabel("KV cache bytes per token (all layers)")
    ax.set_ylabel(f"KL vs {result['baseline']} (nats, mean over positions)")
    ax.set_title(f"{result['model']} ({result['engine']} engine): KV formats")
    ax.legend(fontsize=7)
    if rec:
        ax2 = axes[0][1]
        ax2.scatter([p["perf"]["itl_slope_ms_per_token"] for p in rec], [p["recovery"]["ci_low"] for p in rec])
        for p in rec:
            ax2.annotate(p["key"].split("|scales")[0], (p["perf"]["itl_slope_ms_per_token"], p["recovery"]["ci_low"]),
                         fontsize=6)
        ax2.set_xlabel("ITL slope (ms per 1k context tokens)")
        ax2.set_ylabel("recovery, 95 % CI lower bound (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
