"""Collects what scripts/gpu/h200_noise_floor.sh produced into one summary.json and a printed table.

    python scripts/gpu/summarize_noise_floor.py WORK_DIR OUT_DIR

WORK_DIR holds div/<step>/divergence.json, niah/batch1/summary.json and steps.tsv; OUT_DIR gets summary.json and
summary.txt (the table, also printed). A step that failed or was skipped is listed as such, never dropped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _fmt(x, spec=".3e") -> str:
    return "-" if x is None else format(x, spec)


def divergence_rows(work: Path) -> list[dict]:
    """One row per (step, bucket or overall): the FP8 arm's KL and top-1 agreement next to the control's."""
    rows = []
    for f in sorted((work / "div").glob("*/divergence.json")):
        d = _load(f)
        if d is None:
            continue
        floor = d.get("noise_floor") or {}
        labels = [*d.get("buckets", {}), "overall"]
        for label in labels:
            v = d["overall"] if label == "overall" else d["buckets"][label]
            c = (floor.get("overall") if label == "overall" else (floor.get("buckets") or {}).get(label)) or {}
            ratio = (floor.get("kl_ratio") or {}).get("overall") if label == "overall" else \
                ((floor.get("kl_ratio") or {}).get("buckets") or {}).get(label)
            rows.append({"step": f.parent.name, "model": d.get("model"), "control": floor.get("name"),
                         "control_inert": floor.get("inert"), "bucket": label, "n_tokens": v.get("n_tokens"),
                         "kl_fp8": v.get("kl_mean"), "top1_fp8": v.get("top1_agree"),
                         "kl_control": c.get("kl_mean"), "top1_control": c.get("top1_agree"), "kl_ratio": ratio,
                         "vllm": ((d.get("arms") or {}).get(d.get("baseline"), {}).get("preflight") or {}).get("vllm_version")})
    return rows


def main(work: Path, out: Path) -> None:
    """Write summary.json and summary.txt into `out` and print the table."""
    out.mkdir(parents=True, exist_ok=True)
    steps = []
    tsv = work / "steps.tsv"
    if tsv.exists():
        for line in tsv.read_text(encoding="utf-8").splitlines():
            name, rc, secs, note = (line.split("\t") + ["", "", "", ""])[:4]
            steps.append({"step": name, "rc": int(rc), "seconds": int(secs), "note": note})
    rows = divergence_rows(work)
    niah = _load(work / "niah" / "batch1" / "summary.json")
    summary = {"steps": steps, "divergence": rows,
               "niah_batch1": {k: niah.get(k) for k in ("recovery", "control", "anatomy")} if niah else None}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    lines = ["step\trc\tseconds\tnote"] + [f"{s['step']}\t{s['rc']}\t{s['seconds']}\t{s['note']}" for s in steps]
    lines += ["", f"{'step':<26} {'bucket':>8} {'n':>6} {'KL fp8':>10} {'top1 fp8':>8} {'KL ctrl':>10} "
                  f"{'top1 ctl':>8} {'KL/ctrl':>8}"]
    for r in rows:
        lines.append(f"{r['step']:<26} {r['bucket']:>8} {r['n_tokens'] or 0:>6} {_fmt(r['kl_fp8']):>10} "
                     f"{_fmt(r['top1_fp8'], '.3f'):>8} {_fmt(r['kl_control']):>10} {_fmt(r['top1_control'], '.3f'):>8} "
                     f"{_fmt(r['kl_ratio'], '.2f'):>8}" + (" (control inert)" if r["control_inert"] else ""))
    c = (niah or {}).get("control")
    if c:
        v, k = c.get("variant") or {}, c.get("control") or {}
        lines += ["", f"niah smollm2 control=batch1: {c.get('n_pairs')} pairs; fp8 flips {v.get('flips')} "
                      f"(lost {v.get('lost')}), control flips {k.get('flips')} (lost {k.get('lost')}); excess "
                      f"{_fmt(c.get('excess_flip_rate'), '+.3f')} CI {c.get('ci')}"]
    elif not niah:
        lines += ["", "niah_batch1: no summary (skipped or failed; see steps)"]
    text = "\n".join(lines) + "\n"
    (out / "summary.txt").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
