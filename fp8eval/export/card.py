"""README.md of a run directory: a Hugging Face dataset card with the verdicts, so the run dir can be pushed as a
dataset as it is (`huggingface_hub upload ORG/NAME RUN_DIR --repo-type dataset`, docs/export.md).

The YAML header is the Hub's dataset-card metadata (tags, a `configs` entry that points the dataset viewer at
records.parquet); the body states the question, the verdict per group and the files.
"""

from __future__ import annotations

import math


def _pct(x) -> str:
    return f"{x:.1f}%" if isinstance(x, (int, float)) and math.isfinite(x) else "–"


def card(summary: dict, hf_id: str | None, files: list[str]) -> str:
    """The card's text for one run's summary.json and the export files written beside it."""
    model, task, base = summary.get("model"), summary.get("task"), summary.get("baseline")
    variants = [k for k, a in (summary.get("arms") or {}).items() if a.get("role") != "baseline"]
    head = ["---", "tags:", "- fp8eval", "- kv-cache", "- fp8", "- evaluation", f"- {task}"]
    if "records.parquet" in files:
        head += ["configs:", "- config_name: records", "  data_files: records.parquet"]
    head += ["---", ""]
    lines = [f"# fp8eval: {model} · {task} · {', '.join(variants) or 'one arm'} vs {base or 'no baseline'}", "",
             "How much accuracy does an FP8 KV cache keep against its BF16 baseline? Both arms ran byte-identical"
             " prompts with the same seeds; recovery = variant score / baseline score × 100, with the verdict's CI"
             " (fp8eval's docs/statistics.md).", ""]
    if hf_id:
        lines += [f"Model: `{hf_id}`.", ""]
    verdict = summary.get("verdict") or {}
    settings = verdict.get("settings") or {}
    if verdict.get("overall"):
        lines += [f"## Verdict (gate {settings.get('gate', 95):g}%)", "",
                  "| group | recovery | CI | verdict |", "|---|---:|---|---|"]
        entries = [("overall", verdict["overall"]), *sorted((verdict.get("by_group") or {}).items())]
        for label, e in entries:
            lines.append(f"| {label} | {_pct(e.get('recovery'))} | {_pct(e.get('ci_low'))}–{_pct(e.get('ci_high'))}"
                         f" | **{e.get('verdict')}** |")
        lines += ["", f"Why (overall): {verdict['overall'].get('why', '')}", ""]
    lines += ["## Arms", "", "| arm | role | score | stderr | samples | skipped | errors |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for name, a in (summary.get("arms") or {}).items():
        score, err = (("–" if a.get(k) is None else f"{a[k]:.4f}") for k in ("score", "stderr"))
        lines.append(f"| {name} | {a.get('role')} | {score} | {err} | {a.get('n_samples')} | {a.get('n_skipped')} |"
                     f" {a.get('n_errors')} |")
    lines += ["", "## Files", ""] + [f"- `{f}`" for f in files] + [""]
    return "\n".join(head + lines)
