"""Collects what scripts/gpu/h200_validation.sh produced into one summary.json and a printed table.

    python scripts/gpu/summarize_validation.py WORK_DIR OUT_DIR

WORK_DIR holds the steps' outputs (probe/probe.json, div/<name>/divergence.json, niah/<name>/summary.json,
steps.tsv); OUT_DIR gets summary.json and summary.txt (the table, also printed). A missing piece (a step
that failed or was skipped) is reported as such, never dropped.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def _load(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _fmt(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


def divergences(work: Path) -> dict:
    out = {}
    for f in sorted((work / "div").glob("*/divergence.json")):
        d = _load(f)
        if d is None:
            continue
        keep = {k: d.get(k) for k in ("model", "kv", "baseline", "engine", "method", "topk", "buckets", "overall",
                                      "topk_view", "elapsed_s")}
        keep["arms"] = {n: {k: a.get(k) for k in ("fingerprint", "passages_computed", "preflight") if k in a}
                        for n, a in (d.get("arms") or {}).items()}
        out[f.parent.name] = keep
    return out


def _topk_buckets(d: dict) -> dict:
    """The buckets measured as a top-k engine measures them (vLLM's own, or a reference run's topk_view)."""
    return (d.get("topk_view") or {}).get("buckets") or (d["buckets"] if d.get("method", "").startswith("topk")
                                                         else {})


def closest_modes(divs: dict) -> dict:
    """Per model: which reference emulation's top-k divergence is closest to the real kernel's, per bucket
    and overall (mean |ln(KL_mode / KL_kernel)| over the shared buckets; top-1 gap as a tie-breaker)."""
    out = {}
    kernels = {d["model"]: (n, d) for n, d in divs.items() if d.get("engine") == "vllm"}
    for model, (kname, kernel) in kernels.items():
        kb = _topk_buckets(kernel)
        modes = {}
        for name, d in divs.items():
            if d.get("engine") != "reference" or d.get("model") != model:
                continue
            mb = _topk_buckets(d)
            shared = [b for b in kb if b in mb and kb[b]["kl_mean"] and mb[b]["kl_mean"]]
            if not shared:
                continue
            per = {b: {"kl_ratio": mb[b]["kl_mean"] / kb[b]["kl_mean"],
                       "top1_gap": mb[b]["top1_agree"] - kb[b]["top1_agree"]} for b in shared}
            modes[name] = {"score": sum(abs(math.log(v["kl_ratio"])) for v in per.values()) / len(per),
                           "top1_gap_mean": sum(abs(v["top1_gap"]) for v in per.values()) / len(per),
                           "per_bucket": per}
        if modes:
            best_overall = min(modes, key=lambda n: (modes[n]["score"], modes[n]["top1_gap_mean"]))
            buckets = sorted({b for m in modes.values() for b in m["per_bucket"]}, key=list(kb).index)
            per_bucket = {b: min((n for n in modes if b in modes[n]["per_bucket"]),
                                 key=lambda n: abs(math.log(modes[n]["per_bucket"][b]["kl_ratio"])))
                          for b in buckets}
            out[model] = {"kernel": kname, "closest": best_overall, "closest_per_bucket": per_bucket,
                          "modes": modes}
    return out


def niah(work: Path) -> dict:
    out = {}
    for f in sorted((work / "niah").glob("*/summary.json")):
        s = _load(f)
        if s is None:
            continue
        arms = {}
        for name, arm in s.get("arms", {}).items():
            meta = _load(Path(arm.get("records", "")).with_suffix(".arm.json")) or {}
            pre = ((meta.get("material") or {}).get("engine") or {}).get("preflight") or {}
            arms[name] = {"score": arm.get("score"), "stderr": arm.get("stderr"), "n_records": arm.get("n_records"),
                          "n_errors": arm.get("n_errors"), "n_skipped": arm.get("n_skipped"),
                          "preflight": {k: pre.get(k) for k in ("vllm_version", "cache_dtype",
                                                                 "kv_cache_dtype_skip_layers", "attention_backend",
                                                                 "device_name", "kv_scales_source")}}
        out[f.parent.name] = {"model": s.get("model"), "baseline": s.get("baseline"), "arms": arms,
                              "recovery": (s.get("recovery") or {}).get("overall")}
    # A run with baseline=none: its recovery against the same model's BF16 arm from another run (same grid).
    bf16 = {r["model"]: r["arms"]["bf16"]["score"] for r in out.values() if "bf16" in r["arms"]}
    for r in out.values():
        if r["recovery"] is None and bf16.get(r["model"]):
            arm = next(iter(r["arms"].values()))
            if arm["score"] is not None:
                r["recovery"] = 100.0 * arm["score"] / bf16[r["model"]]
                r["recovery_from"] = "the bf16 arm of another niah run of this model"
    return out


def steps(work: Path) -> list[dict]:
    rows = []
    path = work / "steps.tsv"
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) >= 3:
                rows.append({"step": parts[0], "rc": int(parts[1]), "seconds": int(parts[2]),
                             "note": parts[3] if len(parts) > 3 else ""})
    return rows


def table(summary: dict) -> str:
    lines = []
    for model, c in summary["closest_modes"].items():
        kernel = summary["divergence"][c["kernel"]]
        kb = _topk_buckets(kernel)
        names = [c["kernel"], *c["modes"]]
        lines.append(f"{model}: top-1 / KL (top-{kernel.get('topk')} shared, renormalised) per bucket, vs each "
                     f"arm's own BF16")
        lines.append(f"{'arm':<26}" + "".join(f"{b:>18}" for b in kb))
        for n in names:
            bb = _topk_buckets(summary["divergence"][n])
            lines.append(f"{n:<26}" + "".join(
                f"{_fmt(bb.get(b, {}).get('top1_agree')) + ' / ' + _fmt(bb.get(b, {}).get('kl_mean'), '.1e'):>18}"
                for b in kb))
        lines.append(f"closest to the kernel: {c['closest']} (mean |ln KL ratio| "
                     f"{c['modes'][c['closest']]['score']:.3f}); per bucket: {c['closest_per_bucket']}")
        lines.append("")
    for name, d in summary["divergence"].items():
        o = d.get("overall") or {}
        lines.append(f"divergence {name:<24} {d.get('engine'):>9} {d.get('kv'):>12} {d.get('method'):>26} "
                     f"KL {_fmt(o.get('kl_mean'), '.3e')} top1 {_fmt(o.get('top1_agree'))} n {o.get('n_tokens')}")
    p = summary.get("probe")
    if p:
        lines.append("")
        names = list(p["rel_error"])
        lines.append(f"probe on {p['device']} ({p['seconds']} s): relative error of FP8 P·V vs float64")
        lines.append(f"{'length':>9}" + "".join(f"{n:>22}" for n in names))
        for i, n in enumerate(p["lengths"]):
            lines.append(f"{n:>9}" + "".join(f"{_fmt(p['rel_error'][k][i], '.3e'):>22}" for k in names))
        if p.get("fit"):
            f = p["fit"]
            lines.append(f"emulated accumulator closest to the hardware: align={f.get('best_align', 'products')}, "
                         f"{f['best_bits']} fraction bits (within 2x at 1k-128k: {f['within_2x']}); set "
                         f"FAST_ACC_ALIGN / FAST_ACC_BITS in fp8eval/engines/attention_emulation.py to match")
    for name, r in summary["niah"].items():
        lines.append("")
        lines.append(f"niah {name} ({r['model']}): recovery {_fmt(r['recovery'], '.1f')} %")
        for arm, a in r["arms"].items():
            pf = a["preflight"]
            lines.append(f"  {arm:<12} score {_fmt(a['score'])} records {a['n_records']} errors {a['n_errors']} "
                         f"cache {pf.get('cache_dtype')} skip {pf.get('kv_cache_dtype_skip_layers')} "
                         f"backend {pf.get('attention_backend')}")
    lines.append("")
    for s in summary["steps"]:
        lines.append(f"step {s['step']:<28} rc {s['rc']:>4} {s['seconds']:>5} s {s['note']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    work, out = Path(argv[0]), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    divs = divergences(work)
    summary = {"divergence": divs, "closest_modes": closest_modes(divs), "probe": _load(work / "probe" / "probe.json"),
               "niah": niah(work), "steps": steps(work)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    text = table(summary)
    (out / "summary.txt").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
