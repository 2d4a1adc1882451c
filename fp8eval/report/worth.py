"""The joined "is FP8 KV worth it?" view: perf.json (speed, capacity) beside the recovery table.

For each model with a perf.json among the report's inputs and each FP8 arm measured there: recovery per
context bucket next to the fitted ITL change at that context, the KV capacity gain and a plain verdict,
e.g. "FP8 KV: yes for contexts above ~7k tokens, recovery ≥ 98 % there".
"""

from __future__ import annotations

import hashlib
import html
import json
import math
from pathlib import Path
from typing import Any

from fp8eval.metrics.groups import length_family, parse_size, split_label
from fp8eval.metrics.latency import R2_WARN, itl_at
from fp8eval.metrics.verdict import decide


def find_perf(paths: list[Path]) -> list[Path]:
    """perf.json files at or under the report's input paths (and next to each run directory's parent)."""
    found: list[Path] = []
    for p in (Path(x) for x in paths):
        if p.is_file() and p.name == "perf.json":
            found.append(p.resolve())
        elif p.is_dir():
            found.extend(f.resolve() for f in sorted(p.rglob("perf.json")))
    return list(dict.fromkeys(found))


def perf_key(paths: list[Path]) -> list[str]:
    """Content hashes of the perf.json inputs (part of the report cache key)."""
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in find_perf(paths)]


def _ttft_at(fit: dict | None, n: float) -> float | None:
    return None if not fit else fit["a"] + fit["b"] * n + fit["c"] * n * n


def _change(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old <= 0:
        return None
    return (new / old - 1.0) * 100.0


def _tokens(n: float) -> str:
    return f"{n / 1000:.0f}k" if n >= 1000 else f"{n:.0f}"


def _finite(x) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def view(perf_paths: list[Path], table, gate: float) -> list[dict[str, Any]]:
    """One entry per (model, FP8 arm) of every perf.json: buckets, capacity gain, break-even, verdict."""
    out = []
    for path in perf_paths:
        perf = json.loads(path.read_text(encoding="utf-8"))
        base = perf["arms"].get(perf.get("baseline")) or {}
        for name, arm in perf["arms"].items():
            if name == perf.get("baseline"):
                continue
            out.append(_entry(path, perf, name, arm, base, table, gate))
    return out


def _entry(path, perf, name, arm, base, table, gate) -> dict[str, Any]:
    model = perf["model"]
    entry: dict[str, Any] = {"model": model, "variant": name, "baseline": perf.get("baseline"), "perf_json": str(path),
                             "dummy_weights": perf.get("dummy_weights"), "buckets": [], "overall_recovery": None}
    if "error" in arm or "error" in base:
        entry["verdict"] = f"no speed figures: {(arm.get('error') or base.get('error'))[:200]}"
        return entry
    be = arm.get("break_even_tokens")
    r2s = [f.get("r2") for f in (arm.get("itl_fit"), base.get("itl_fit")) if f and f.get("r2") is not None]
    entry.update(break_even_tokens=be, capacity_gain=arm.get("capacity_gain"), min_itl_r2=min(r2s) if r2s else None,
                 throughput_change_pct=_change(((arm.get("throughput") or {}).get("output_tok_s")),
                                               ((base.get("throughput") or {}).get("output_tok_s"))))
    rows = table[(table["model"] == model) & (table["variant"] == name)] if table is not None and len(table) else None
    if rows is not None and len(rows):
        overall = rows[rows["group"] == "all"]
        if len(overall):
            entry["overall_recovery"] = _finite(overall["recovery_pct"].min())
        fam = length_family([g for g in rows["group"] if g != "all"])
        for r in rows.itertuples():
            if r.group == "all" or fam is None or split_label(r.group)[0] != fam:
                continue
            n = parse_size(split_label(r.group)[1])
            entry["buckets"].append({
                "task": r.task, "bucket": r.group, "tokens": n, "recovery_pct": _finite(r.recovery_pct),
                "ci_low": _finite(r.ci_low), "ci_high": _finite(r.ci_high), "n": int(r.n),
                "itl_change_pct": _change(itl_at(arm.get("itl_fit"), n), itl_at(base.get("itl_fit"), n)),
                "ttft_change_pct": _change(_ttft_at(arm.get("ttft_fit"), n), _ttft_at(base.get("ttft_fit"), n))})
        entry["buckets"].sort(key=lambda b: (b["tokens"], b["task"]))
    entry["verdict"] = verdict(entry, gate)
    if entry["min_itl_r2"] is not None and entry["min_itl_r2"] < R2_WARN:
        entry["verdict"] += (f" (an ITL fit has R² {entry['min_itl_r2']:.2f}: the latencies are noisy, so the "
                             "break-even is rough)")
    return entry


def verdict(e: dict[str, Any], gate: float) -> str:
    """The plain sentence: where FP8 KV is faster per token and whether accuracy holds there."""
    cap = e.get("capacity_gain")
    cap_s = f"; the cache holds {cap:.2f}x the tokens" if cap else ""
    be = e.get("break_even_tokens")
    if be is None:
        return f"FP8 KV: not faster per token at any measured context (ITL grows as fast as BF16's){cap_s}"
    where = "at every context" if be == 0 else f"for contexts above ~{_tokens(be)} tokens"
    above = [b for b in e["buckets"] if b["tokens"] is not None and b["tokens"] >= be and b["recovery_pct"] is not None]
    if not above:
        rec = e.get("overall_recovery")
        rec_s = f"; overall recovery {rec:.1f} % (no context bucket measured there)" if rec is not None \
            else "; no recovery measured at those contexts"
        return f"FP8 KV: faster {where}{rec_s}{cap_s}"
    judged = [decide(b["ci_low"], b["ci_high"], gate) for b in above]  # the one gate rule, on each bucket's CI
    worst = min(b["recovery_pct"] for b in above)
    lows = [b["ci_low"] for b in above if b["ci_low"] is not None]
    if all(j == "pass" for j in judged):
        return (f"FP8 KV: yes {where}: every bucket there passes the {gate:g} % gate (CI lower ends ≥"
                f" {math.floor(min(lows) * 10) / 10:g} %){cap_s}")
    if "fail" in judged:
        return (f"FP8 KV: faster {where}, but a bucket there fails the {gate:g} % gate (its CI is below it; worst"
                f" recovery {worst:.1f} %): not worth it on accuracy{cap_s}")
    low_s = f", lowest CI end {min(lows):.1f} %" if lows else ""
    return (f"FP8 KV: faster {where}; accuracy there is undecided: the buckets' CIs straddle the {gate:g} % gate"
            f" (worst recovery {worst:.1f} %{low_s}): measure more before relying on it{cap_s}")


def _pct(x, signed: bool = False) -> str:
    if x is None:
        return "–"
    return f"{x:+.1f} %" if signed else f"{x:.1f} %"


BUCKET_COLUMNS = ("task", "bucket", "tokens", "recovery", "CI low", "n", "ITL change", "TTFT change")


def _bucket_cells(b: dict[str, Any]) -> list[str]:
    return [str(b["task"]), str(b["bucket"]), f"{b['tokens']:,.0f}", _pct(b["recovery_pct"]), _pct(b["ci_low"]),
            str(b["n"]), _pct(b["itl_change_pct"], True), _pct(b["ttft_change_pct"], True)]


def markdown(entries: list[dict[str, Any]]) -> str:
    """The report.md section (empty string when there is no perf.json)."""
    if not entries:
        return ""
    lines = ["## Is FP8 KV worth it? (speed from perf.json beside recovery)", "",
             ("ITL/TTFT change = the variant's fitted latency at the bucket's context over the baseline's, "
              "minus 1 (negative: FP8 faster). Speed from `python -m fp8eval.perf` (docs/perf.md)."), ""]
    for e in entries:
        lines.append(f"### {e['model']} · {e['variant']} vs {e['baseline']}"
                     + (" (speed on dummy weights)" if e.get("dummy_weights") else ""))
        lines.append("")
        lines.append(f"**{e['verdict']}.**")
        be, cap = e.get("break_even_tokens"), e.get("capacity_gain")
        lines.append("")
        lines.append(f"Break-even context: {'none' if be is None else f'{be:,.0f} tokens'} · KV capacity gain: "
                     f"{'–' if cap is None else f'{cap:.2f}x'} · throughput change: "
                     f"{_pct(e.get('throughput_change_pct'), True)} · perf.json: `{e['perf_json']}`")
        if e["buckets"]:
            lines += ["", "| " + " | ".join(BUCKET_COLUMNS) + " |", "|---|---|" + "---:|" * (len(BUCKET_COLUMNS) - 2)]
            lines += ["| " + " | ".join(_bucket_cells(b)) + " |" for b in e["buckets"]]
        lines.append("")
    return "\n".join(lines) + "\n"


def html_section(entries: list[dict[str, Any]]) -> str:
    """The same section for index.html (inline, no external resources)."""
    if not entries:
        return ""
    esc = html.escape
    parts = ["<h2>Is FP8 KV worth it?</h2>",
             ("<p class='note'>Speed from perf.json (python -m fp8eval.perf) beside recovery per context bucket; "
              "ITL change &lt; 0 means FP8 is faster at that context.</p>")]
    for e in entries:
        parts.append(f"<h3>{esc(e['model'])} · {esc(e['variant'])} vs {esc(str(e['baseline']))}</h3>")
        parts.append(f"<p class='decision'><b>{esc(e['verdict'])}.</b></p>")
        if e["buckets"]:
            parts.append("<table><thead><tr>" + "".join(f"<th>{c}</th>" for c in BUCKET_COLUMNS) + "</tr></thead><tbody>")
            parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in _bucket_cells(b)) + "</tr>" for b in e["buckets"]]
            parts.append("</tbody></table>")
    return "\n".join(parts) + "\n"


def write(paths: list[Path], table, gate: float, out: Path) -> list[dict[str, Any]]:
    """worth.json into the report directory; returns the entries (empty when no perf.json was found)."""
    entries = view(find_perf(paths), table, gate)
    if entries:
        (out / "worth.json").write_text(json.dumps(entries, indent=2, default=str) + "\n", encoding="utf-8")
    return entries
