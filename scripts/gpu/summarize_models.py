"""models.json (scripts/gpu/h200_models.sh) -> the docs/gpu-validation.md table: model, architecture, started,
audit result, KV capacity bf16 / fp8, backend; then the corpus and the headline command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def architecture(model: str, starts: list[dict]) -> str:
    """The architecture of conf/perf_models/<model>/config.json, its layer count, and the hf_overrides it was
    started with (layer-reduced starts say so)."""
    try:
        cfg = json.loads((ROOT / "conf" / "perf_models" / model / "config.json").read_text())
    except (OSError, ValueError):
        return "?"
    text = cfg.get("text_config") or cfg
    out = f"{(cfg.get('architectures') or ['?'])[0]} ({text.get('num_hidden_layers', '?')} layers"
    reduced = sorted({o.split("=", 1)[1] for s in starts for o in s.get("overrides", [])
                      if o.startswith("++engine.engine_args.hf_overrides=")})
    return out + (f"; started with {', '.join(reduced)})" if reduced else ")")


def audit_cell(start: dict) -> str:
    """ok / the problem categories / the start error."""
    if not start.get("started"):
        return "not started: " + str(start.get("error", "?"))[:120].replace("|", "/").replace("\n", " ")
    audit = start.get("audit") or {}
    probs = audit.get("problems") or []
    if not probs:
        return "ok" if audit else "no audit"
    cats = sorted({p["category"] for p in probs})
    first = probs[0]
    return f"{','.join(cats)}: {first['layer']} asked {first['asked']} got {first['got']}"[:160].replace("|", "/")


def table(data: dict) -> str:
    """The markdown table and the corpus/headline lines."""
    by_model: dict[str, dict[str, dict]] = {}
    for s in data.get("starts", []):
        by_model.setdefault(s.get("model", "?"), {})[s.get("kv", "?")] = s
    lines = ["| model | architecture | started (bf16/fp8/fp8_skip_sw) | audit bf16 | audit fp8 | audit fp8_skip_sw | "
             "capacity bf16 | capacity fp8 | backend |", "|---|---|---|---|---|---|---|---|---|"]
    for model in sorted(by_model):
        arms = by_model[model]
        started = "/".join(("yes" if arms[k].get("started") else "no") if k in arms else "-"
                           for k in ("bf16", "fp8", "fp8_skip_sw"))
        backends = sorted({b for a in arms.values() for b in ((a.get("audit") or {}).get("backends") or {})})
        cap = lambda k: f"{arms[k]['capacity_tokens']:,}" if arms.get(k, {}).get("capacity_tokens") else "-"  # noqa: E731
        lines.append(f"| {model} | {architecture(model, list(arms.values()))} | {started} | "
                     + " | ".join(audit_cell(arms[k]) if k in arms else "-" for k in ("bf16", "fp8", "fp8_skip_sw"))
                     + f" | {cap('bf16')} | {cap('fp8')} | {', '.join(backends) or '-'} |")
    corpus = data.get("corpus") or {}
    lines.append("")
    for c in corpus.get("cases", []):
        lines.append(f"- corpus `{c['case']}` on {c['engine']}: {'caught' if c['caught'] else 'NOT caught'} ({c.get('how')})")
    if corpus.get("skipped"):
        lines.append(f"- corpus: skipped ({corpus['skipped']})")
    if "error" in corpus:
        lines.append(f"- corpus: no result ({corpus['error']})")
    h = data.get("headline") or {}
    if "arms" in h:
        rec = (h.get("recovery") or {}).get("overall")
        lines.append(f"- headline `python -m fp8eval model={h.get('model')} kv=fp8 model.dummy=true`: ran, "
                     f"arms {list(h['arms'])}, recovery {rec} ({h.get('accuracy_note', 'no dummy label!')})")
    else:
        lines.append(f"- headline: no summary.json ({str(h.get('error'))[:200]})")
    return "\n".join(lines) + "\n"


def main() -> int:
    """CLI: summarize_models.py models.json > table.md"""
    if len(sys.argv) != 2:
        print("usage: summarize_models.py models.json", file=sys.stderr)
        return 2
    print(table(json.loads(Path(sys.argv[1]).read_text())), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
