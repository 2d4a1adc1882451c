"""models.json (scripts/gpu/h200_models.sh) -> the docs/gpu-validation.md table: model, architecture, started,
audit result, KV capacity bf16 / fp8, backend; then the corpus and the headline command."""

from __future__ import annotations

import json
import re
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


_ABS_PATH = re.compile(r"(?<![\w.])/(?:[^\s'\"/|]+/)+([^\s'\"/|]+)")


def without_paths(text: str) -> str:
    """Error text for the docs: every absolute path (the GPU box's cache and work dirs) cut to its last part."""
    return _ABS_PATH.sub(r"\1", text)


def audit_cell(start: dict) -> str:
    """ok / the problem categories / the start error."""
    if not start.get("started"):
        return "not started: " + without_paths(str(start.get("error", "?")))[:120].replace("|", "/").replace("\n", " ")
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


def merge(new: dict, old: dict) -> dict:
    """Two sessions' models.json as one: the new run's start of a (model, arm) replaces the old one's; the old
    run's other starts stay, listed under `from_previous`; corpus and headline from the new run unless it has
    none (skipped or no result)."""
    key = lambda s: (s.get("model"), s.get("kv"))  # noqa: E731
    fresh = {key(s) for s in new.get("starts", [])}
    kept = [s for s in old.get("starts", []) if key(s) not in fresh]
    out = {"starts": new.get("starts", []) + kept, "from_previous": sorted(f"{m}/{k}" for m, k in map(key, kept))}
    for part in ("corpus", "headline"):
        n = new.get(part) or {}
        out[part] = old.get(part) if (not n or "error" in n or n.get("skipped")) and old.get(part) else n
    return out


USAGE = "usage: summarize_models.py models.json [--over PREVIOUS_models.json]"


def main() -> int:
    """CLI: summarize_models.py models.json [--over PREVIOUS_models.json] > table.md"""
    args = sys.argv[1:]
    if args in (["-h"], ["--help"]):
        print(f"{USAGE}  (the markdown table on stdout)")
        return 0
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--over"):
        print(USAGE, file=sys.stderr)
        return 2
    data = json.loads(Path(args[0]).read_text())
    if len(args) == 3:
        data = merge(data, json.loads(Path(args[2]).read_text()))
    text = table(data)
    if data.get("from_previous"):
        text += f"- from the previous run (not started again): {', '.join(data['from_previous'])}\n"
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
