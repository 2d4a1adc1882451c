"""divergence.png: KL and top-1 agreement per position bucket (matplotlib, the `report` extra)."""

from __future__ import annotations

from pathlib import Path


def plot_divergence(result: dict, path: Path) -> Path:
    """Two panels over the position buckets: mean KL (log scale) and top-1 agreement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(result["buckets"])
    kl = [result["buckets"][b]["kl_mean"] or 0.0 for b in labels]
    top1 = [result["buckets"][b]["top1_agree"] or 0.0 for b in labels]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    x = range(len(labels))
    a1.plot(x, kl, marker="o")
    if any(v > 0 for v in kl):
        a1.set_yscale("log")
    a1.set_ylabel("mean KL(baseline || variant), nats")
    a2.plot(x, top1, marker="o", color="tab:orange")
    a2.set_ylabel("top-1 agreement")
    a2.set_ylim(min(top1 + [0.9]) - 0.02, 1.0)
    for ax in (a1, a2):
        ax.set_xticks(list(x), labels, rotation=30)
        ax.set_xlabel("position bucket (tokens)")
        ax.grid(alpha=0.3)
    k = f", top-{result['topk']}" if result.get("topk") else ""
    fig.suptitle(f"{result['model']} on {result['engine']}: {result['kv']} vs {result['baseline']}{k}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
