"""Collects what scripts/gpu/h200_decode_path.sh produced (issue 35) into summary.json and summary.md.

    python scripts/gpu/summarize_decode_path.py WORK_DIR OUT_DIR

WORK_DIR holds each step's run directory (div/<step>/divergence.json, from `python -m fp8eval.divergence
divergence.path=both`) and steps.tsv; OUT_DIR gets summary.json and summary.md (the tables for docs/gpu-validation.md,
also printed):

1. the path gap per model, engine and arm: |log p_decode - log p_prefill| of each passage token, per position bucket
   (mean, max, share above 1e-3); the BF16 arm's is the floor;
2. each run's KL(BF16 || FP8) per bucket on both paths (top-k footing: vLLM's own top-20, the reference engine's
   top-20 view) and, per reference step, the emulation's KL over the kernel's (the vllm step of the same model and KV
   format) on each path (the target: within 25 % from 256 tokens on).

A step that failed, timed out or was skipped is listed as such, never dropped; exit 1 when no step produced a result.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TARGET = 0.25  # the emulation's KL within 25 % of the kernel's, per bucket from 256 tokens on
FIRST_BUCKET = "0-256"  # left out of the target


def _load(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _fmt(x, spec=".2e") -> str:
    return "-" if x is None else format(x, spec)


def runs(work: Path) -> dict:
    """{step: the parts of its divergence.json the tables use} for every step that wrote one."""
    out = {}
    for f in sorted((work / "div").glob("*/divergence.json")):
        d = _load(f)
        if d is None or "paths" not in d:
            continue
        kl = {}
        for path, r in d["paths"].items():
            view = r.get("topk_view") or r  # the reference engine's top-k view: vLLM's footing
            kl[path] = {b: v.get("kl_mean") for b, v in (view.get("buckets") or {}).items()}
        out[f.parent.name] = {"model": d.get("model"), "engine": d.get("engine"), "kv": d.get("kv"),
                              "text": (d.get("continuation") or {}).get("kind", "text"),
                              "baseline": d.get("baseline"), "kl_topk": kl, "path_gap": d.get("path_gap") or {},
                              "arms": {n: (a or {}).get("preflight", {}).get("attention_backend")
                                       for n, a in (d.get("arms") or {}).items()},
                              "elapsed_s": d.get("elapsed_s")}
    return out


def steps(work: Path) -> list[dict]:
    """steps.tsv as rows {name, rc, seconds, note}."""
    rows = []
    try:
        lines = (work / "steps.tsv").read_text(encoding="utf-8").splitlines()
    except OSError:
        return rows
    for line in lines:
        parts = line.split("\t") + ["", "", "", ""]
        rows.append({"name": parts[0], "rc": parts[1], "seconds": parts[2], "note": parts[3]})
    return rows


def emulation(res: dict) -> dict:
    """Per reference-engine step: its KL over vLLM's (the vllm step of the same model, KV format and forced text) per bucket on each
    path, and whether every bucket from 256 tokens on is within TARGET."""
    out: dict = {}
    for name, emu in res.items():
        if emu["engine"] != "reference":
            continue
        same = ("model", "kv", "text")  # the kernel's run of the same model, KV format and forced text
        kern = next((r for r in res.values() if r["engine"] == "vllm" and all(r[k] == emu[k] for k in same)), None)
        if kern is None:
            continue
        for path in ("prefill", "decode"):
            k, e = kern["kl_topk"].get(path, {}), emu["kl_topk"].get(path, {})
            ratio = {b: (e[b] / k[b] if k.get(b) and e.get(b) is not None else None) for b in k}
            judged = [r for b, r in ratio.items() if b != FIRST_BUCKET]
            ok = bool(judged) and all(r is not None and abs(r - 1) <= TARGET for r in judged)
            out.setdefault(name, {"model": emu["model"], "kv": emu["kv"]})[path] = {"ratio": ratio, "within_target": ok}
    return out


def markdown(res: dict, emu: dict, rows: list[dict]) -> str:
    lines = ["### Path gap: |log p_decode - log p_prefill| of the passage's token (per arm; BF16 is the floor)", "",
             "| step | model | engine | arm | bucket | mean abs | max abs | share > 1e-3 | n |",
             "|---|---|---|---|---|---|---|---|---|"]
    for step, r in res.items():
        for arm, g in r["path_gap"].items():
            for b, v in [*g["buckets"].items(), ("overall", g["overall"])]:
                lines.append(f"| {step} | {r['model']} | {r['engine']} | {arm} | {b} | {_fmt(v.get('mean_abs'), '.3f')} | "
                             f"{_fmt(v.get('max_abs'), '.2f')} | {_fmt(v.get('share_above_1e-3'), '.0%')} | "
                             f"{v.get('n_tokens')} |")
    lines += ["", "### KL(BF16 || FP8) per bucket on both paths (top-20, renormalised)", "",
              "| step | model | engine | kv | bucket | prefill | decode | decode / prefill |",
              "|---|---|---|---|---|---|---|---|"]
    for step, r in res.items():
        pre, dec = r["kl_topk"].get("prefill", {}), r["kl_topk"].get("decode", {})
        for b in dec:
            q = dec[b] / pre[b] if pre.get(b) and dec[b] is not None else None
            lines.append(f"| {step} | {r['model']} | {r['engine']} | {r['kv']} | {b} | {_fmt(pre.get(b))} | {_fmt(dec[b])} | "
                         f"{_fmt(q, '.2f')} |")
    if emu:
        paths = ("prefill", "decode")
        buckets = sorted({b for m in emu.values() for p in paths if p in m for b in m[p]["ratio"]}, key=_bucket_order)
        lines += ["", f"### Emulation / kernel KL per bucket (target: within {TARGET:.0%} from 256 tokens on)", "",
                  "| emulation (step) | model | kv | path | " + " | ".join(buckets) + " | within |",
                  "|---|---|---|---|" + "---|" * (len(buckets) + 1)]
        for step, m in emu.items():
            for path in paths:
                if path in m:
                    v = m[path]
                    cells = " | ".join(_fmt(v["ratio"].get(b), ".2f") for b in buckets)
                    lines.append(f"| {step} | {m['model']} | {m['kv']} | {path} | {cells} | "
                                 f"{'yes' if v['within_target'] else 'no'} |")
    bad = [s for s in rows if s["rc"] not in ("0", "")]
    if bad:
        lines += ["", "Steps without a result: " + "; ".join(f"{s['name']} (rc {s['rc']}{', ' + s['note'] if s['note'] else ''})"
                                                            for s in bad)]
    return "\n".join(lines) + "\n"


def _bucket_order(label: str) -> int:
    lo = label.split("-")[0].rstrip("+")
    return int(lo[:-1]) * 1024 if lo.endswith("k") else int(lo)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    work, out = Path(argv[0]), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    res, rows = runs(work), steps(work)
    emu = emulation(res)
    summary = {"runs": res, "emulation_over_kernel": emu, "steps": rows, "target": TARGET}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    md = markdown(res, emu, rows)
    (out / "summary.md").write_text(md, encoding="utf-8")
    print(md)
    if not res:
        print("summarize_decode_path: no step produced a divergence.json with both paths", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
