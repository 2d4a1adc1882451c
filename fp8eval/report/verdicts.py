"""Verdicts: the recovery gate, the sign test for a systematic shift, flip lists, one decision.

Rules (docs/report.md and docs/statistics.md state them for readers):
- gate: pass when the CI's lower end is at or above the gate (non-inferiority; `unsure_margin`, 0 by
  default, lets a user accept a lower end that many points below it); fail when even the CI's upper end is
  below the gate; otherwise inconclusive, naming how many more samples or repeats would decide it. The CI
  is metrics.verdict's (Bonett-Price or clustered Fieller), the one summary.json carries.
- shift: when the variant is below the baseline in more buckets (or tasks) than a fair coin allows
  (exact one-sided sign test, p <= sign_alpha), recommend calibration even if every single gap is
  inside its own error band (the seed study's Kimi-K2.5 case).
- flips: records scored right (score >= right_at) in one arm and wrong in the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from fp8eval.metrics import stats
from fp8eval.metrics.groups import label_sort_key
from fp8eval.metrics.verdict import decide, more_sentence
from fp8eval.report.analysis import Pair, per_sample


@dataclass
class Thresholds:
    gate: float = 95.0  # recovery % an arm must keep (the seed study's guidance)
    unsure_margin: float = 0.0  # points the CI's lower end may reach below the gate for a pass (a user's choice)
    sign_alpha: float = 0.05  # one-sided sign-test level for a systematic downward shift
    right_at: float = 0.5  # a record is "right" when its score is at least this (flip lists)
    z: float = 1.96  # a single bucket's gap is "inside its error band" when |gap| <= z * stderr
    shift_margin: float = 1.0  # points: a shift worth calibrating is one whose CI excludes a drop smaller than this

    @classmethod
    def from_kwargs(cls, **kw) -> "Thresholds":
        """Thresholds from keyword arguments; TypeError naming any unknown one."""
        valid = set(cls.__dataclass_fields__)
        unknown = set(kw) - valid
        if unknown:
            raise TypeError(f"unknown threshold(s) {sorted(unknown)}; valid: {sorted(valid)}")
        return cls(**kw)


def _pct(x: float) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.1f}%"


def gate_verdict(recovery: float, low: float, high: float, th: Thresholds, level: float = 0.95,
                 more: str = "") -> tuple[str, str]:
    """(verdict, one-sentence reason) for one recovery value and its CI by the one gate rule
    (`metrics.verdict.decide`, the summary's and the sequential stop's); `more` says what would decide an
    inconclusive one (metrics.verdict's more_samples / more_repeats)."""
    lv = f"{level * 100:.0f}%"
    if recovery is None or not math.isfinite(recovery):
        return "n/a", "recovery is undefined (the baseline scored 0 or no record was scored in both arms)"
    if not (math.isfinite(low) and not math.isnan(high)):
        return "inconclusive", f"recovery {_pct(recovery)} has no CI, so the gate of {th.gate:g}% cannot be judged"
    ci = f"recovery {_pct(recovery)} ({lv} CI {_pct(low)} to {_pct(high)})"
    more = more or "more samples or repeats would decide it"
    verdict = decide(low, high, th.gate, th.unsure_margin)
    if verdict == "fail":
        return "fail", f"{ci}: even the CI's upper end is below the {th.gate:g}% gate"
    if verdict == "pass":
        slack = f" (less the {th.unsure_margin:g}-point margin allowed)" if th.unsure_margin else ""
        return "pass", f"{ci}: the CI's lower end is at or above the {th.gate:g}% gate{slack}"
    if recovery >= th.gate:
        return "inconclusive", (f"{ci}: above the {th.gate:g}% gate, but the CI reaches {th.gate - low:.1f} points"
                                f" below it; {more}")
    return "inconclusive", f"{ci}: below the {th.gate:g}% gate but the CI reaches above it; {more}"


def _more(row) -> str:
    out = ""
    if math.isfinite(getattr(row, "more_samples", math.nan)):
        chance = getattr(row, "more_samples_chance", math.nan)
        out = more_sentence(int(row.more_samples), chance if math.isfinite(chance) else None)
    if math.isfinite(getattr(row, "more_repeats", math.nan)):
        out += ("; " if out else "") + (f"{int(row.more_repeats)} more repeats per sample might"
                                        f"{' too' if out else ' decide it'} (a normal approximation whose chance"
                                        " is not simulated)")
    return out


def add_verdicts(table: pd.DataFrame, th: Thresholds, level: float) -> pd.DataFrame:
    """A copy of the recovery table with `verdict` and `why` columns (gate_verdict of each row)."""
    out = table.copy()
    verdicts = [gate_verdict(r.recovery_pct, r.ci_low, r.ci_high, th, level, _more(r)) for r in out.itertuples()]
    out["verdict"] = [v for v, _ in verdicts]
    out["why"] = [w for _, w in verdicts]
    return out


def apply_run_decisions(table: pd.DataFrame, runs) -> pd.DataFrame:
    """A run with stop=sequential has one decision, the sequential one (summary.json `verdict.decision`,
    metrics.verdict.set_sequential_decision): it replaces that pair's overall verdict here too, so the
    terminal, summary.json and the report say the same."""
    out = table.copy()
    for run in runs:
        dec = ((run.summary.get("verdict") or {}).get("decision") or {})
        if dec.get("by") != "sequential" or run.variant_kv not in run.arms:
            continue
        mask = ((out["model"] == run.model) & (out["task"] == run.task) & (out["group"] == "all")
                & (out["variant"] == run.arms[run.variant_kv].label))
        out.loc[mask, "verdict"] = dec["verdict"]
        out.loc[mask, "why"] = dec["why"]
    return out


def headline_rows(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, task, baseline, variant): AUC when the task has it (MRCR's headline, as in
    the seed study), else the overall pass@1."""
    picks = []
    for _, g in table.groupby(["model", "task", "baseline", "variant"], sort=True):
        auc = g[g["group"] == "auc"]
        picks.append((auc if len(auc) else g[g["group"] == "all"]).iloc[0])
    return pd.DataFrame(picks).reset_index(drop=True) if picks else table.iloc[0:0]


# --- sign tests ---------------------------------------------------------------------------------------
@dataclass
class SignTest:
    model: str
    scope: str  # the task (buckets of one task) or "tasks" (across tasks)
    baseline: str
    variant: str
    unit: str  # "bucket" | "task"
    n_below: int
    n_above: int
    n_ties: int
    n_below_outside_band: int  # downward gaps that are significant on their own
    p_value: float
    alpha: float
    units: list[dict]

    @property
    def n_units(self) -> int:
        """Units (buckets or tasks) tested: below, above and tied."""
        return self.n_below + self.n_above + self.n_ties

    @property
    def shift(self) -> bool:
        """Whether the variant shows a systematic downward shift: more units below than above, p <= alpha."""
        return self.n_below > self.n_above and self.p_value <= self.alpha

    def explain(self) -> str:
        """The test's result in one or two sentences, with the advice that follows from it."""
        head = (f"{self.variant} is below {self.baseline} in {self.n_below} of {self.n_units} {self.unit}s"
                f" ({self.n_above} above, {self.n_ties} tied); exact one-sided sign test p = {self.p_value:.4f}")
        need = stats.min_units_for_sign_test(self.alpha)
        if self.shift:
            inside = self.n_below - self.n_below_outside_band
            return (f"{head} <= {self.alpha:g}: a systematic downward shift"
                    + (f", although {inside} of the {self.n_below} downward gaps are each inside their own"
                       " error band" if inside else "")
                    + " (no margin: the recommendation comes from the CI-based verdicts).")
        if self.n_below + self.n_above < need:
            return (f"{head}: too few {self.unit}s with a difference for the test to reach p <= {self.alpha:g}"
                    f" (needs at least {need}); no conclusion about a shift.")
        return f"{head} > {self.alpha:g}: no systematic shift."


def _direction(diff: float, eps: float = 1e-12) -> str:
    return "below" if diff < -eps else "above" if diff > eps else "tie"


def bucket_sign_test(pair: Pair, th: Thresholds) -> SignTest | None:
    """Across the disjoint cells of one task (MRCR buckets, needle ctx×depth cells)."""
    df = pair.paired
    cells = sorted(c for c in df["cell"].unique() if c) if len(df) else []
    if len(cells) < 2:
        return None
    units = []
    for cell in cells:
        ps = per_sample(df[df["cell"] == cell])
        diff, se = stats.paired_diff_z(ps["b"], ps["v"], ps["c"])
        outside = math.isfinite(se) and se > 0 and diff < -th.z * se
        if math.isfinite(se) and se == 0 and diff < 0:
            outside = True  # every sample moved the same way
        units.append({"unit": cell, "baseline": float(ps["b"].sum() / ps["c"].sum()),
                      "variant": float(ps["v"].sum() / ps["c"].sum()), "diff": diff, "stderr": se,
                      "direction": _direction(diff), "outside_band": bool(outside)})
    return _sign(pair.model, pair.task, pair.baseline.label, pair.variant.label, "bucket", units, th)


def task_sign_tests(headline: pd.DataFrame, th: Thresholds) -> list[SignTest]:
    """Across tasks, per (model, baseline, variant), on the headline numbers."""
    out = []
    for (model, base, var), g in headline.groupby(["model", "baseline", "variant"], sort=True):
        if len(g) < 2:
            continue
        units = []
        for r in g.itertuples():
            diff = r.variant_score - r.baseline_score
            outside = math.isfinite(r.ci_high) and r.ci_high < 100.0
            units.append({"unit": r.task, "baseline": r.baseline_score, "variant": r.variant_score,
                          "diff": diff, "stderr": math.nan, "direction": _direction(diff),
                          "outside_band": bool(outside)})
        out.append(_sign(model, "tasks", base, var, "task", units, th))
    return out


def _sign(model, scope, base, var, unit, units, th: Thresholds) -> SignTest:
    below = sum(u["direction"] == "below" for u in units)
    above = sum(u["direction"] == "above" for u in units)
    ties = len(units) - below - above
    return SignTest(model, scope, base, var, unit, below, above, ties,
                    sum(u["direction"] == "below" and u["outside_band"] for u in units),
                    stats.sign_test(below, above), th.sign_alpha, units)


# --- flips --------------------------------------------------------------------------------------------
FLIP_COLUMNS = ["model", "task", "baseline", "variant", "direction", "sample_id", "repeat", "groups",
                "baseline_score", "variant_score", "baseline_extracted", "variant_extracted",
                "baseline_record", "variant_record"]


def flips(pair: Pair, th: Thresholds) -> pd.DataFrame:
    """The pair's flips: records right in one arm and wrong in the other (score >= right_at), each with both records'
    file:line."""
    df = pair.paired
    if not len(df):
        return pd.DataFrame(columns=FLIP_COLUMNS)
    b_right = df["b_score"] >= th.right_at
    v_right = df["v_score"] >= th.right_at
    rows = []
    for direction, mask in (("lost", b_right & ~v_right), ("gained", ~b_right & v_right)):
        for r in df[mask].itertuples():
            rows.append({
                "model": pair.model, "task": pair.task, "baseline": pair.baseline.label,
                "variant": pair.variant.label, "direction": direction, "sample_id": r.sample_id,
                "repeat": r.repeat, "groups": " ".join(sorted(r.groups, key=label_sort_key)),
                "baseline_score": r.b_score, "variant_score": r.v_score,
                "baseline_extracted": r.b_extracted, "variant_extracted": r.v_extracted,
                "baseline_record": f"{pair.baseline.records_path}:{r.b_line}",
                "variant_record": f"{pair.variant.records_path}:{r.v_line}",
            })
    return pd.DataFrame(rows, columns=FLIP_COLUMNS)


# --- the decision -------------------------------------------------------------------------------------
def decisions(headline: pd.DataFrame, sign_tests: list[SignTest], shift_margin: float | None = None) -> list[dict]:
    """One recommendation per (model, baseline, variant) from its tasks' CI-based verdicts: stay on baseline
    when a task fails the gate, calibrate when a task's difference CI excludes drops smaller than
    `shift_margin` points, undecided, or keep; a sign-test shift is reported beside, never decides."""
    out = []
    for (model, base, var), g in headline.groupby(["model", "baseline", "variant"], sort=True):
        shifts = [s for s in sign_tests if s.model == model and s.baseline == base and s.variant == var
                  and s.shift]
        # calibrate: a task whose difference CI excludes every drop smaller than the margin (a CI-based verdict;
        # the sign test alone has no margin and at large n finds shifts too small to matter)
        margin = shift_margin if shift_margin is not None else Thresholds.shift_margin
        worth = [r.task for r in g.itertuples() if math.isfinite(getattr(r, "diff_high_pts", math.nan))
                 and r.diff_high_pts < -margin]
        failed = list(g[g["verdict"] == "fail"]["task"])
        unsure = list(g[g["verdict"].isin(["inconclusive", "n/a"])]["task"])
        passed = list(g[g["verdict"] == "pass"]["task"])
        shift_where = [s.scope if s.unit == "bucket" else "across tasks" for s in shifts]
        if failed:
            decision = "stay on baseline"
            text = (f"{var} fails the gate on {', '.join(failed)}: stay on {base} for this workload, or try"
                    " calibrated scales / skipping layers and measure again.")
        elif worth:
            decision = "calibrate"
            text = (f"{var} passes or is undecided per task, but on {', '.join(worth)} its difference CI excludes"
                    f" every drop smaller than {margin:g} points: calibrate the KV scales before relying on it.")
        elif unsure:
            decision = "undecided"
            text = (f"{var} is not decided on {', '.join(unsure)}: the CI straddles the gate (or is undefined);"
                    " add samples or repeats (each verdict says how many).")
        else:
            decision = "keep"
            text = f"{var} keeps the gate on every task ({', '.join(passed)}): FP8 KV is fine here."
        if shifts:
            text += (f" The sign test finds a systematic downward shift ({', '.join(shift_where)}); it has no"
                     f" margin, so on its own it is no reason to calibrate.")
        out.append({"model": model, "baseline": base, "variant": var, "decision": decision, "text": text,
                    "tasks_pass": passed, "tasks_fail": failed, "tasks_unsure": unsure})
    return out
