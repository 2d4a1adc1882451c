"""report.md and the self-contained index.html.

Verdict badges use the figures' colour-blind-safe colours (fp8eval.report.forest): blue pass, vermillion fail,
grey dashed inconclusive; no red-green pair anywhere.

The HTML loads nothing: figures are inlined as base64 PNG, styles and the table-sorting script are
inline, and a Content-Security-Policy forbids any other source, so the page cannot touch the network.
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

import fp8eval.report.backends as backends
import fp8eval.report.noise as noise
from fp8eval.report.figures import Figure
from fp8eval.report.verdicts import SignTest, Thresholds

FLIPS_SHOWN = 200  # per page section; the full list is always in flips.csv
COMPLETION_SHOWN = 600  # characters of each completion in the page's flip table


@dataclass
class ReportData:
    table: pd.DataFrame
    headline: pd.DataFrame
    arm_stats: pd.DataFrame
    sign_tests: list[SignTest]
    flips: pd.DataFrame
    decisions: list[dict]
    figures: list[Figure]
    thresholds: Thresholds
    level: float
    n_boot: int
    run_dirs: list[Path]
    notes: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    backends: pd.DataFrame | None = None  # fp8eval.report.backends.backend_table
    noise: pd.DataFrame | None = None  # fp8eval.report.noise.noise_table (runs with a control arm)


def _f(x, digits: int = 1, pct: bool = False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if pct:
        return f"{x:.{digits}f}%"
    return f"{x:.{digits}f}"


def _ci(r) -> str:
    return f"{_f(r.ci_low)}–{_f(r.ci_high)}" if math.isfinite(r.ci_low) else "–"


def _rel(fig_path: Path, out: Path) -> str:
    try:
        return str(fig_path.relative_to(out))
    except ValueError:
        return str(fig_path)


CI_METHODS = ("Bonett-Price hybrid Wilson score for binary scores with one record per sample, else Fieller's"
              " interval over clusters (samples, or NIAH cells) with a one-flip variance floor; MRCR's AUC row"
              " keeps its stratified bootstrap widened to the pass@1 CI's relative width.")


# --- markdown ---------------------------------------------------------------------------------------
def render_markdown(d: ReportData, out: Path) -> str:
    """The text of report.md: refused pairs, decision, headline recovery and why, sign tests, flips, figures, all rows,
    notes and inputs."""
    th = d.thresholds
    lv = f"{d.level * 100:.0f}%"
    lines = ["# FP8 KV cache recovery report", ""]
    lines += [f"Recovery = variant score / baseline score × 100, on records paired by (sample, repeat);"
              f" {lv} CI: {CI_METHODS} Gate {th.gate:g}% (pass only when the CI's lower end is at or above it),"
              f" margin {th.unsure_margin:g} points, sign-test alpha {th.sign_alpha:g},"
              f" a record is right when its score ≥ {th.right_at:g}. MDE: the drop (points of score) at which this"
              " run's CI would end below 100% with 80% probability if FP8 lost whole samples (or clusters) at"
              " random and the run's other disagreements were noise without a direction (docs/statistics.md"
              " sections 4 and 8).", ""]
    if d.refused:
        lines += ["## Refused pairs", ""] + [f"- {m}" for m in d.refused] + [""]
    lines += ["## Decision", ""]
    if not d.decisions:
        lines += ["No baseline/variant pair was found, so there is no recovery to judge.", ""]
    for dec in d.decisions:
        lines.append(f"- **{dec['model']} · {dec['variant']} vs {dec['baseline']}: {dec['decision']}.** {dec['text']}")
    lines += ["", "## Headline recovery", "",
              "| model | task | baseline | variant | metric | baseline | variant | recovery | CI | n | lost/gained"
              " | MDE pts | verdict |",
              "|---|---|---|---|---|---:|---:|---:|---|---:|---|---:|---|"]
    for r in d.headline.itertuples():
        metric = r.group if r.metric == "auc" else "pass@1"
        lines.append(f"| {r.model} | {r.task} | {r.baseline} | {r.variant} | {metric} | {_f(r.baseline_score, 4)}"
                     f" | {_f(r.variant_score, 4)} | {_f(r.recovery_pct, 1, True)} | {_ci(r)} | {r.n} |"
                     f" {r.lost}/{r.gained} | {_f(r.mde_pts, 1)} | **{r.verdict}** |")
    lines += ["", "### Why", ""]
    for r in d.headline.itertuples():
        lines.append(f"- {r.model} · {r.task} · {r.variant}: **{r.verdict}**: {r.why}.")
    if d.backends is not None:
        lines += [""] + backends.markdown(d.backends)
    lines += ["", "## Systematic shift (sign tests)", ""]
    if not d.sign_tests:
        lines.append("No task has two or more buckets, and no model has two or more tasks: nothing to test.")
    for s in d.sign_tests:
        where = f"{s.model} · {s.scope}" if s.unit == "bucket" else f"{s.model} · across tasks"
        lines.append(f"- {where} · {s.variant} vs {s.baseline}: {s.explain()}")
    lines += ["", "## Flips", "",
              f"A flip is a (sample, repeat) right in one arm and wrong in the other (right = score ≥ {th.right_at:g}):"
              " *lost* = right in the baseline, wrong in the variant; *gained* = the reverse. Full list with"
              " record references (file:line) in `flips.csv`.", ""]
    if d.flips.empty:
        lines.append("No flips.")
    else:
        counts = d.flips.groupby(["model", "task", "baseline", "variant", "direction"]).size().unstack(fill_value=0)
        lines += ["| model | task | baseline | variant | lost | gained |", "|---|---|---|---|---:|---:|"]
        for key, row in counts.iterrows():
            lines.append(f"| {' | '.join(key)} | {row.get('lost', 0)} | {row.get('gained', 0)} |")
        lines += ["", "First lost records per task:", ""]
        for (model, task, var), g in d.flips[d.flips["direction"] == "lost"].groupby(["model", "task", "variant"]):
            for r in g.head(5).itertuples():
                lines.append(f"- {model} · {task} · {var}: `{r.sample_id}` repeat {r.repeat}"
                             f" ({_f(r.baseline_score, 2)} → {_f(r.variant_score, 2)}): `{r.variant_record}`"
                             + noise.anatomy_text(r._asdict()))
    lines += noise.markdown(d.noise, d.level)
    lines += ["", "## Figures", ""]
    for fig in d.figures:
        lines += [f"### {fig.title}", "", f"![{fig.title}]({_rel(fig.png, out)})", "",
                  f"{fig.caption} SVG: `{_rel(fig.svg, out)}`.", ""]
    lines += ["## All rows", "",
              "Every (model, task, variant, group) with its CI, n and length-cutoff rates is in `recovery.csv`;"
              " per-arm scores in `arms.csv`. Rows per group:", ""]
    lines += ["| model | task | variant | group | baseline | variant | recovery | CI | n | cutoff b/v | verdict |",
              "|---|---|---|---|---:|---:|---:|---|---:|---|---|"]
    for r in d.table.itertuples():
        lines.append(f"| {r.model} | {r.task} | {r.variant} | {r.group} | {_f(r.baseline_score, 4)} |"
                     f" {_f(r.variant_score, 4)} | {_f(r.recovery_pct, 1, True)} | {_ci(r)} | {r.n} |"
                     f" {_f(r.baseline_cutoff_rate, 3)}/{_f(r.variant_cutoff_rate, 3)} | {r.verdict} |")
    excluded = d.table[(d.table["group"] == "all") & (d.table["n_excluded"] > 0)]
    if len(excluded) or d.notes:
        lines += ["", "## Notes", ""]
        for r in excluded.itertuples():
            lines.append(f"- {r.model} · {r.task} · {r.variant}: {r.n_excluded} (sample, repeat) records were"
                         " not scored in both arms (skipped, errors or missing in one arm) and are left out"
                         " of the recovery.")
        lines += [f"- {n}" for n in d.notes]
    lines += ["", "## Inputs", ""] + [f"- `{p}`" for p in d.run_dirs] + [""]
    return "\n".join(lines)


# --- html -------------------------------------------------------------------------------------------
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Liberation Sans",sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2f4f;color:#fff;padding:18px 28px}
header h1{margin:0;font-size:22px}
header p{margin:6px 0 0;opacity:.85}
main{padding:12px 28px 40px;max-width:1500px}
section{background:#fff;border:1px solid #e1e4ea;border-radius:8px;padding:14px 18px;margin:16px 0}
h2{font-size:17px;margin:2px 0 10px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{padding:5px 8px;border-bottom:1px solid #eceef2;text-align:left;white-space:nowrap}
td.num{text-align:right;font-variant-numeric:tabular-nums}
td.wrap{white-space:normal;min-width:160px;max-width:420px;overflow-wrap:anywhere}
td.long{min-width:260px;font-family:ui-monospace,monospace;font-size:12px;white-space:pre-wrap}
h3{font-size:14px;margin:12px 0 4px}ul.why{margin:0;padding-left:20px}ul.why li{margin:3px 0;overflow-wrap:anywhere}
th{background:#f0f2f6;cursor:pointer;user-select:none;position:sticky;top:0}
th[aria-sort=ascending]::after{content:" ▲"} th[aria-sort=descending]::after{content:" ▼"}
.scroll{max-height:520px;overflow:auto}.full{overflow-x:auto}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;font-size:12px}
.pass,.keep{background:#d4e6f5;color:#08467a}.fail,.stay{background:#f8d6bf;color:#8a3300}
.inconclusive,.undecided,.na{background:#ececec;color:#333;border:1px dashed #8a8a8a}.calibrate{background:#fdf0cf;color:#6b4a00}
.decision{margin:6px 0}
figure{margin:10px 0 22px}figure img{max-width:100%;height:auto;border:1px solid #eceef2}
figcaption{color:#555;font-size:12.5px;margin-top:4px}
.note{color:#555}.refused{color:#8a1c1c}
code{font-size:12px}
"""

_JS = """
function sortTable(th){
  const table=th.closest('table'), body=table.tBodies[0], idx=[...th.parentNode.children].indexOf(th);
  const asc=th.getAttribute('aria-sort')!=='ascending';
  [...th.parentNode.children].forEach(h=>h.removeAttribute('aria-sort'));
  th.setAttribute('aria-sort',asc?'ascending':'descending');
  const key=td=>{const v=td.dataset.v!==undefined?td.dataset.v:td.textContent.trim();const n=parseFloat(v);
    return (v!==''&&!isNaN(n)&&isFinite(v))?[0,n]:[1,v.toLowerCase()];};
  const rows=[...body.rows].sort((a,b)=>{const x=key(a.cells[idx]),y=key(b.cells[idx]);
    if(x[0]!==y[0])return x[0]-y[0];return (x[1]<y[1]?-1:x[1]>y[1]?1:0)*(asc?1:-1);});
  rows.forEach(r=>body.appendChild(r));
}
document.querySelectorAll('table.sortable th').forEach(th=>th.addEventListener('click',()=>sortTable(th)));
document.body.dataset.ready='1';
"""


def _cell(value, kind: str = "text") -> str:
    if kind == "num":
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return '<td class="num" data-v="">–</td>'
        return f'<td class="num" data-v="{value}">{value:.4g}</td>' if isinstance(value, float) \
            else f'<td class="num" data-v="{value}">{value}</td>'
    if kind == "pct":
        if value is None or not math.isfinite(value):
            return '<td class="num" data-v="">–</td>'
        return f'<td class="num" data-v="{value}">{value:.1f}%</td>'
    if kind == "verdict":
        cls = "na" if value == "n/a" else html.escape(str(value))
        return f'<td><span class="badge {cls}">{html.escape(str(value))}</span></td>'
    if kind == "long":  # a completion: wrapped, cut at COMPLETION_SHOWN characters (flips.csv has it whole)
        text = "" if value is None or (isinstance(value, float) and not math.isfinite(value)) else str(value)
        cut = text[:COMPLETION_SHOWN] + (" …" if len(text) > COMPLETION_SHOWN else "")
        return f'<td class="wrap long">{html.escape(cut)}</td>'
    cls = ' class="wrap"' if kind == "wrap" else ""
    return f"<td{cls}>{html.escape('' if value is None else str(value))}</td>"


# Column -> header shown on the page (the CSVs keep the column names). A column not listed is shown with its
# underscores as spaces.
HEADERS = {
    "baseline_score": "baseline score", "variant_score": "variant score", "recovery_pct": "recovery",
    "ci_low": "CI low", "ci_high": "CI high", "ci": "CI", "ci_method": "CI method", "n": "pairs", "n_samples": "samples",
    "n_repeats": "repeats", "mde_pts": "MDE (points)", "baseline_cutoff_rate": "baseline cut off",
    "variant_cutoff_rate": "variant cut off", "n_excluded": "excluded", "more_samples": "more samples to decide",
    "more_samples_chance": "chance they decide",
    "more_repeats": "more repeats to decide", "attention_backend": "attention backend", "run_dir": "run",
    "p_value": "p-value", "cutoff_rate": "cut off", "n_skipped": "skipped", "n_errors": "errors",
    "sample_id": "sample", "baseline_extracted": "baseline answer", "variant_extracted": "variant answer",
    "baseline_completion": "baseline completion", "variant_completion": "variant completion",
    "baseline_record": "baseline record", "variant_record": "variant record", "stderr": "std. error",
}


def header(column: str) -> str:
    """The readable header of a column (HEADERS, else its underscores as spaces)."""
    return HEADERS.get(column, column.replace("_", " "))


def _table(df: pd.DataFrame, kinds: dict[str, str], table_id: str, scroll: bool = True) -> str:
    head = "".join(f'<th data-col="{html.escape(c)}">{html.escape(header(c))}</th>' for c in kinds)
    body = []
    for _, r in df.iterrows():
        body.append("<tr>" + "".join(_cell(r[c], k) for c, k in kinds.items()) + "</tr>")
    wrapper = "scroll" if scroll else "full"
    return (f'<div class="{wrapper}"><table class="sortable" id="{table_id}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _img(fig: Figure) -> str:
    data = base64.b64encode(fig.png.read_bytes()).decode("ascii")
    return (f'<figure><img alt="{html.escape(fig.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(fig.caption)}</figcaption></figure>")


def _why_list(headline: pd.DataFrame) -> str:
    """Each headline verdict's reason as a wrapped paragraph under the table (in a column it was clipped)."""
    items = "".join(f'<li><b>{html.escape(f"{r.model} · {r.task} · {r.variant}")}</b>: {_cell(r.verdict, "verdict")[4:-5]}'
                    f" {html.escape(str(r.why))} <span class=\"note\">(CI: {html.escape(str(r.ci_method))})</span>.</li>"
                    for r in headline.itertuples())
    return f'<h3>Why</h3><ul class="why">{items}</ul>' if items else ""


def render_html(d: ReportData) -> str:
    """The text of index.html: the report as one page that loads nothing (figures inlined, tables sortable)."""
    th = d.thresholds
    lv = f"{d.level * 100:.0f}%"
    parts = []
    if d.refused:
        parts.append('<section><h2>Refused pairs</h2>' + "".join(
            f'<p class="refused">{html.escape(m)}</p>' for m in d.refused) + "</section>")
    dec = "".join(
        f'<p class="decision"><span class="badge {html.escape(x["decision"].split()[0])}">{html.escape(x["decision"])}</span> '
        f'<b>{html.escape(x["model"])} · {html.escape(x["variant"])} vs {html.escape(x["baseline"])}</b>: '
        f'{html.escape(x["text"])}</p>' for x in d.decisions) or "<p>No baseline/variant pair found.</p>"
    parts.append(f"<section><h2>Decision</h2>{dec}</section>")
    head = d.headline.assign(metric=d.headline.apply(lambda r: r["group"] if r["metric"] == "auc" else "pass@1", axis=1),
                             ci=[_ci(r) + ("%" if math.isfinite(r.ci_low) else "") for r in d.headline.itertuples()])
    # As narrow as the page: the CI in one column, its method and the reason in the list under the table.
    parts.append("<section><h2>Headline recovery</h2>" + _table(head, {
        "model": "text", "task": "text", "baseline": "text", "variant": "text", "metric": "text",
        "baseline_score": "num", "variant_score": "num", "recovery_pct": "pct", "ci": "text", "n": "num",
        "lost": "num", "gained": "num", "mde_pts": "num", "verdict": "verdict"}, "headline", scroll=False)
        + _why_list(d.headline) + "</section>")
    if d.backends is not None and len(d.backends):
        parts.append("<section><h2>Recovery by attention backend</h2>" + _table(d.backends, {
            "model": "text", "task": "text", "baseline": "text", "variant": "text", "attention_backend": "text",
            "verified": "text", "recovery_pct": "pct", "run_dir": "text"}, "backends", scroll=False) + "</section>")
    figs = "".join(_img(f) for f in d.figures)
    parts.append(f'<section id="figures"><h2>Figures</h2>{figs}</section>')
    parts.append("<section><h2>Recovery per group</h2>" + _table(d.table, {
        "model": "text", "task": "text", "baseline": "text", "variant": "text", "group": "text",
        "baseline_score": "num", "variant_score": "num", "recovery_pct": "pct", "ci_low": "pct",
        "ci_high": "pct", "n": "num", "n_samples": "num", "n_repeats": "num",
        "baseline_cutoff_rate": "num", "variant_cutoff_rate": "num", "n_excluded": "num",
        "lost": "num", "gained": "num", "mde_pts": "num", "more_samples": "num", "more_samples_chance": "num",
        "more_repeats": "num",
        "verdict": "verdict"}, "recovery") + "</section>")
    if d.sign_tests:
        st = pd.DataFrame([{"model": s.model, "scope": s.scope if s.unit == "bucket" else "across tasks",
                            "baseline": s.baseline, "variant": s.variant, "below": s.n_below,
                            "above": s.n_above, "ties": s.n_ties, "p_value": s.p_value,
                            "shift": "yes" if s.shift else "no", "explanation": s.explain()}
                           for s in d.sign_tests])
        parts.append("<section><h2>Systematic shift (sign tests)</h2>" + _table(st, {
            "model": "text", "scope": "text", "baseline": "text", "variant": "text", "below": "num",
            "above": "num", "ties": "num", "p_value": "num", "shift": "text", "explanation": "wrap"},
            "signtests", scroll=False) + "</section>")
    parts.append("<section><h2>Arms</h2>" + _table(d.arm_stats[d.arm_stats["group"] == "all"], {
        "model": "text", "task": "text", "arm": "text", "fingerprint": "text", "score": "num",
        "stderr": "num", "n": "num", "n_samples": "num", "n_repeats": "num", "cutoff_rate": "num",
        "n_skipped": "num", "n_errors": "num", "records": "text"}, "arms") + "</section>")
    flips_note = (f'<p class="note">Right = score ≥ {th.right_at:g}. lost: right in the baseline, wrong in the'
                  f" variant; gained: the reverse. {len(d.flips)} flips in all"
                  + (f"; the first {FLIPS_SHOWN} are shown, all are in flips.csv." if len(d.flips) > FLIPS_SHOWN
                     else ".") + "</p>")
    if d.noise is not None and not d.noise.empty:
        parts.append("<section><h2>Noise floor (control arms)</h2><p class=\"note\">Excess = the variant's flip rate"
                     " minus the control's on the same pairs, with a paired interval (Newcombe; clustered by sample).</p>"
                     + _table(d.noise, {c: "num" if c not in ("model", "task", "baseline", "variant", "control",
                                                               "setting", "inert") else "text"
                                         for c in noise.NOISE_COLUMNS}, "noise", scroll=False) + "</section>")
    parts.append("<section><h2>Flips</h2>" + flips_note + _table(d.flips.head(FLIPS_SHOWN), {
        "model": "text", "task": "text", "variant": "text", "direction": "text", "sample_id": "text",
        "repeat": "num", "groups": "text", "baseline_score": "num", "variant_score": "num",
        "baseline_extracted": "text", "variant_extracted": "text", "baseline_completion": "long",
        "variant_completion": "long", **{c: "text" for c in noise.ANATOMY_COLUMNS.values()},
        "baseline_record": "text", "variant_record": "text"}, "flips")
        + "</section>")
    notes = [html.escape(n) for n in d.notes] + [f"<code>{html.escape(str(p))}</code>" for p in d.run_dirs]
    parts.append("<section><h2>Notes and inputs</h2>" + "".join(f"<p class=\"note\">{n}</p>" for n in notes)
                 + "</section>")
    subtitle = (f"Recovery = variant / baseline × 100 on records paired by (sample, repeat); {lv} CI: {CI_METHODS}"
                f" Gate {th.gate:g}% (pass only when the CI's lower end is at or above it), margin"
                f" {th.unsure_margin:g} points, sign-test alpha {th.sign_alpha:g}.")
    csp = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="icon" href="data:,"><title>fp8eval recovery report</title><style>{_CSS}</style></head>'
            f'<body><header><h1>fp8eval · FP8 KV cache recovery</h1><p>{html.escape(subtitle)}</p></header>'
            f'<main>{"".join(parts)}</main><script>{_JS}</script></body></html>\n')
