"""Pairing arms record by record, and the numbers of recovery.csv.

A pair is (baseline arm, variant arm) of one model and task. Records are joined on (sample_id, repeat);
only records scored in both arms count. Everything left out is counted, never dropped silently.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field

import pandas as pd

from fp8eval.metrics import stats
from fp8eval.metrics import verdict as gate
from fp8eval.metrics.arm import group_numbers, grouped
from fp8eval.metrics.auc import context_arena_auc
from fp8eval.metrics.groups import BARE_FAMILY, cell_key, label_sort_key, parse_size, split_label
from fp8eval.metrics.pairing import PairingError, pair_records, recovery_of
from fp8eval.metrics.select import is_scored
from fp8eval.report.load import Arm, Run
from fp8eval.tasks import REGISTRY, task_class


@dataclass
class Pair:
    model: str
    task: str
    baseline: Arm
    variant: Arm
    paired: pd.DataFrame  # one row per (sample_id, repeat) scored in both arms
    excluded: dict[str, int] = field(default_factory=dict)
    all_keys: pd.DataFrame | None = None  # every (sample, repeat) of either arm with its groups/status


@dataclass
class Settings:
    n_boot: int = 2000
    level: float = 0.95
    seed: int = 0
    gate: float = 95.0  # the verdict columns (metrics.verdict): the CI is at `level`
    power: float = 0.8
    right_at: float = 0.5
    margin: float = 0.0  # the report's --unsure-margin (metrics.verdict.GateSettings.margin)

    def gate_settings(self) -> gate.GateSettings:
        """The summary's verdict settings for these report settings."""
        return gate.GateSettings(gate=self.gate, alpha=1.0 - self.level, power=self.power, right_at=self.right_at,
                                 margin=self.margin)


def cluster_of(task: str):
    """The task's record -> cluster function (`Task.cluster_of`); the sample for a task not registered."""
    return task_class(task).cluster_of if task in REGISTRY else (lambda sample_id, groups: sample_id)


def row_seed(base: int, *key: object) -> int:
    """Each CSV row's bootstrap seed depends only on what the row is, not on its position."""
    text = "\x1f".join(str(k) for k in (base, *key))
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def pair_arms(baseline: Arm, variant: Arm) -> Pair:
    """Join two arms with `metrics.pairing` (the rule the summary uses) and lay the pairs out as a frame."""
    bv, vv = baseline.task_versions, variant.task_versions
    if bv != vv:
        raise PairingError(
            f"refusing to pair {variant.model}/{variant.task}: task_version {sorted(bv)} in baseline"
            f" {baseline.label} ({baseline.records_path}) but {sorted(vv)} in variant {variant.label}"
            f" ({variant.records_path}). The task changed between the runs; rerun both arms with one"
            " version.")
    b_recs = [r.data for r in baseline.records]
    v_recs = [r.data for r in variant.records]

    def where(side: str, i: int) -> str:
        arm = baseline if side == "baseline" else variant
        return f"{arm.records_path.name}:{arm.records[i].line}"

    try:
        paired = pair_records(b_recs, v_recs, where)
    except PairingError as e:
        raise PairingError(f"refusing to pair {variant.model}/{variant.task} (baseline {baseline.label}, variant"
                           f" {variant.label}): {e}") from None
    rows, keys = [], []
    for k in paired.keys:
        keys.append({"sample_id": k.sample_id, "repeat": k.repeat, "groups": k.groups, "excluded": k.excluded})
        if k.excluded:
            continue
        b, v = baseline.records[k.baseline], variant.records[k.variant]
        rows.append({
            "sample_id": k.sample_id, "repeat": k.repeat, "groups": k.groups, "cell": cell_key(k.groups),
            "b_score": float(b.data["score"]), "v_score": float(v.data["score"]),
            "b_length": b.data.get("finish_reason") == "length",
            "v_length": v.data.get("finish_reason") == "length",
            "b_line": b.line, "v_line": v.line,
            "b_extracted": b.data.get("extracted"), "v_extracted": v.data.get("extracted"),
        })
    cols = ["sample_id", "repeat", "groups", "cell", "b_score", "v_score", "b_length", "v_length",
            "b_line", "v_line", "b_extracted", "v_extracted"]
    return Pair(variant.model, variant.task, baseline, variant, pd.DataFrame(rows, columns=cols),
                dict(paired.excluded), pd.DataFrame(keys, columns=["sample_id", "repeat", "groups", "excluded"]))


def build_pairs(runs: list[Run], strict: bool = True) -> tuple[list[Pair], list[str]]:
    """Every (baseline, variant) arm pair named by a run, once. With strict=False a pair that cannot be
    paired is left out and its message returned; with strict=True it raises."""
    pairs: dict[tuple[str, str], Pair] = {}
    refused: list[str] = []
    for run in runs:
        if run.baseline is None:
            continue
        b = run.arms[run.baseline]
        for kv, v in run.arms.items():
            if kv == run.baseline or (b.fingerprint, v.fingerprint) in pairs:
                continue
            try:
                pairs[(b.fingerprint, v.fingerprint)] = pair_arms(b, v)
            except PairingError as e:
                if strict:
                    raise
                refused.append(str(e))
    return list(pairs.values()), list(dict.fromkeys(refused))


def per_sample(df: pd.DataFrame) -> pd.DataFrame:
    """Per-sample sums over paired repeats: the resampling unit of the bootstrap."""
    return (df.groupby("sample_id", sort=True)
              .agg(b=("b_score", "sum"), v=("v_score", "sum"), c=("b_score", "size"))
              .reset_index())


def group_labels(pair: Pair) -> list[str]:
    """Every group label of the pair's records, in label order."""
    labels = {g for gs in pair.all_keys["groups"] for g in gs} if pair.all_keys is not None else set()
    return sorted(labels, key=label_sort_key)


def _rows_in_group(df: pd.DataFrame, group: str) -> pd.DataFrame:
    if group == "all":
        return df
    return df[df["groups"].map(lambda gs: group in gs)]


def recovery_row(pair: Pair, group: str, settings: Settings) -> dict:
    """One row of the recovery table: both arms' scores and stderrs, recovery % with the summary's CI
    (`metrics.verdict`: Bonett-Price or clustered Fieller) and the paired bootstrap beside it, the MDE,
    what would decide it, counts and cutoff rates, over the pair's records in `group`."""
    df = _rows_in_group(pair.paired, group)
    keys = _rows_in_group(pair.all_keys, group)
    ps = per_sample(df)
    boot = stats.paired_bootstrap_recovery(
        ps["b"].to_numpy(), ps["v"].to_numpy(), n_boot=settings.n_boot, level=settings.level,
        seed=row_seed(settings.seed, pair.model, pair.task, pair.baseline.fingerprint,
                      pair.variant.fingerprint, group))
    n = len(df)
    # Point values from the same functions as summary.json (metrics.arm, metrics.pairing), in record order.
    b = group_numbers(_as_records(df, "b"))
    v = group_numbers(_as_records(df, "v"))
    point = recovery_of(list(zip(df["b_score"], df["v_score"])))
    clus = cluster_of(pair.task)
    judged = gate.entry([(str(clus(s, tuple(g))), float(x), float(y)) for s, g, x, y in
                         zip(df["sample_id"], df["groups"], df["b_score"], df["v_score"])], settings.gate_settings(),
                        samples=int(ps.shape[0]) or None, sample_ids=[str(s) for s in df["sample_id"]])
    return {
        "model": pair.model, "task": pair.task, "baseline": pair.baseline.label,
        "variant": pair.variant.label, "group": group, "metric": "pass@1",
        "baseline_score": _nan(b["score"]), "variant_score": _nan(v["score"]),
        "baseline_stderr": _nan(b["stderr"]), "variant_stderr": _nan(v["stderr"]),
        "recovery_pct": _nan(point), "ci_low": _nan(judged["ci_low"]), "ci_high": _inf(judged["ci_high"], point),
        "n": n, "n_samples": int(ps.shape[0]), "n_repeats": int(df["repeat"].nunique()) if n else 0,
        "baseline_cutoff_rate": _nan(b["length_cutoff_rate"]),
        "variant_cutoff_rate": _nan(v["length_cutoff_rate"]),
        "n_excluded": int((keys["excluded"] != "").sum()),
        "baseline_arm": pair.baseline.fingerprint[:12], "variant_arm": pair.variant.fingerprint[:12],
        **_judged_columns(judged), "boot_low": boot.low, "boot_high": boot.high,
    }


def _judged_columns(e: dict) -> dict:
    return {"ci_method": e["ci_method"], "diff_pts": _nan(e["diff_pts"]), "diff_low_pts": _nan(e["diff_low_pts"]),
            "diff_high_pts": _nan(e["diff_high_pts"]), "mde_pts": _nan(e["mde_pts"]), "lost": e["lost"],
            "gained": e["gained"], "n_clusters": e["n_clusters"], "more_samples": _nan(e["more_samples"]),
            "more_samples_chance": _nan(e.get("more_samples_chance")), "more_repeats": _nan(e["more_repeats"])}


def _inf(x: float | None, point: float | None) -> float:
    """An upper CI end: None from metrics.verdict means unbounded (inf) when there is a point, else NaN."""
    if x is not None:
        return float(x)
    return math.inf if point is not None else math.nan


def _as_records(df: pd.DataFrame, side: str) -> list[dict]:
    """One arm's side of the paired rows as the records `metrics.arm.group_numbers` reads, in row order."""
    return [{"sample_id": s, "repeat": r, "status": "ok", "score": x, "finish_reason": "length" if cut else None}
            for s, r, x, cut in zip(df["sample_id"], df["repeat"], df[f"{side}_score"], df[f"{side}_length"])]


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


# --- MRCR AUC ---------------------------------------------------------------------------------------
AUC_KEYS = {"auc": None, "auc_1m": 1024 * 1024}  # summary key -> up_to (None: the arm's largest bucket)


def _auc(scores_by_edge: dict[int, float], up_to: int) -> float:
    """Context Arena's AUC (`metrics.auc`); NaN where it is undefined for these buckets (a gap)."""
    try:
        return float(context_arena_auc(scores_by_edge, up_to))
    except ValueError:
        return math.nan


def auc_rows(pair: Pair, settings: Settings) -> tuple[list[dict], list[str]]:
    """AUC recovery rows when both arms' summaries carry `auc` / `auc_1m`. The CI resamples samples
    within each bucket; it is given only when recomputing the AUC from the records reproduces the
    summary's value, so the CI is surely of the same quantity."""
    rows, notes = [], []
    df = pair.paired
    bucket = df["groups"].map(lambda gs: next((g for g in gs if split_label(g)[0] == BARE_FAMILY
                                               and parse_size(g) is not None), None))
    for key, up_to_fixed in AUC_KEYS.items():
        b_val, v_val = pair.baseline.summary.get(key), pair.variant.summary.get(key)
        if b_val is None or v_val is None:
            continue
        b_val, v_val = float(b_val), float(v_val)
        point = stats.recovery_pct(b_val, v_val)
        low = high = math.nan
        ok = bucket.notna()
        if ok.any():
            sub = df[ok].assign(edge=bucket[ok].map(lambda g: int(parse_size(g))))
            up_to = up_to_fixed or int(sub["edge"].max())
            ps = (sub.groupby(["edge", "sample_id"]).agg(b=("b_score", "sum"), v=("v_score", "sum"),
                                                         c=("b_score", "size")).reset_index())

            def stat(bm: dict, vm: dict, up_to=up_to) -> float:
                b_auc = _auc(bm, up_to)
                if not b_auc:
                    raise ZeroDivisionError
                return 100.0 * _auc(vm, up_to) / b_auc

            b_re = _auc((sub.groupby("edge")["b_score"].mean()).to_dict(), up_to)
            v_re = _auc((sub.groupby("edge")["v_score"].mean()).to_dict(), up_to)
            if math.isclose(b_re, b_val, abs_tol=1e-6) and math.isclose(v_re, v_val, abs_tol=1e-6):
                ci = stats.stratified_paired_bootstrap(
                    ps["b"].to_numpy(), ps["v"].to_numpy(), ps["c"].to_numpy(), list(ps["edge"]), stat,
                    n_boot=settings.n_boot, level=settings.level,
                    seed=row_seed(settings.seed, pair.model, pair.task, pair.baseline.fingerprint,
                                  pair.variant.fingerprint, key))
                low, high = ci.low, ci.high
            else:
                notes.append(f"{pair.model}/{pair.task}/{pair.variant.label}: {key} recomputed from the"
                             f" paired records ({b_re:.4f} / {v_re:.4f}) differs from summary.json"
                             f" ({b_val:.4f} / {v_val:.4f}); its CI is left empty.")
        rows.append({
            "model": pair.model, "task": pair.task, "baseline": pair.baseline.label,
            "variant": pair.variant.label, "group": key, "metric": "auc",
            "baseline_score": b_val, "variant_score": v_val, "baseline_stderr": math.nan,
            "variant_stderr": math.nan, "recovery_pct": point, "ci_low": low, "ci_high": high,
            "n": len(df), "n_samples": int(df["sample_id"].nunique()),
            "n_repeats": int(df["repeat"].nunique()) if len(df) else 0,
            "baseline_cutoff_rate": _nan(group_numbers(_as_records(df, "b"))["length_cutoff_rate"]),
            "variant_cutoff_rate": _nan(group_numbers(_as_records(df, "v"))["length_cutoff_rate"]),
            "n_excluded": int((pair.all_keys["excluded"] != "").sum()),
            "baseline_arm": pair.baseline.fingerprint[:12], "variant_arm": pair.variant.fingerprint[:12],
        })
    return rows, notes


def recovery_table(pairs: list[Pair], settings: Settings) -> tuple[pd.DataFrame, list[str]]:
    """The recovery table of every pair (its 'all' row, one per group, then the task's extra rows such as MRCR's AUC),
    and the notes those extra rows bring."""
    rows: list[dict] = []
    notes: list[str] = []
    for pair in sorted(pairs, key=lambda p: (p.model, p.task, p.variant.label, p.baseline.label)):
        first = len(rows)
        for group in ["all", *group_labels(pair)]:
            rows.append(recovery_row(pair, group, settings))
        extra, extra_notes = auc_rows(pair, settings)
        rows.extend(widen_to(r, rows[first]) for r in extra)
        notes.extend(extra_notes)
    return pd.DataFrame(rows, columns=RECOVERY_COLUMNS), notes


def widen_to(auc: dict, all_row: dict) -> dict:
    """An AUC row's CI: its stratified bootstrap (kept in boot_low / boot_high), widened to at least the
    relative width of the pass@1 row's honest CI: a bootstrap over few samples without a flip has zero
    width, which is no evidence (docs/statistics.md)."""
    out = {**auc, "boot_low": auc["ci_low"], "boot_high": auc["ci_high"],
           **{k: all_row[k] for k in ("lost", "gained", "n_clusters", "more_samples", "more_samples_chance",
                                 "more_repeats")},
           "diff_pts": math.nan, "diff_low_pts": math.nan, "diff_high_pts": math.nan, "mde_pts": math.nan,
           "ci_method": "stratified bootstrap, at least the pass@1 CI's relative width"}
    point, ref = auc["recovery_pct"], all_row["recovery_pct"]
    if not (math.isfinite(point) and math.isfinite(ref) and ref > 0):
        return out
    rel_lo, rel_hi = all_row["ci_low"] / ref, all_row["ci_high"] / ref
    lo, hi = auc["ci_low"], auc["ci_high"]
    out["ci_low"] = min(lo, point * rel_lo) if math.isfinite(lo) else point * rel_lo
    out["ci_high"] = max(hi, point * rel_hi) if math.isfinite(hi) else point * rel_hi
    return out


RECOVERY_COLUMNS = [
    "model", "task", "baseline", "variant", "group", "metric", "baseline_score", "variant_score",
    "baseline_stderr", "variant_stderr", "recovery_pct", "ci_low", "ci_high", "n", "n_samples",
    "n_repeats", "baseline_cutoff_rate", "variant_cutoff_rate", "n_excluded", "baseline_arm",
    "variant_arm",
    # issue 22: the CI above is metrics.verdict's (its method named); the paired bootstrap stays beside it
    "ci_method", "diff_pts", "diff_low_pts", "diff_high_pts", "mde_pts", "lost", "gained", "n_clusters",
    "more_samples", "more_samples_chance", "more_repeats", "boot_low", "boot_high",
]


def attach_completions(flips: pd.DataFrame) -> pd.DataFrame:
    """The flips with both arms' completions (`baseline_completion`, `variant_completion`), read from the records
    their `file:line` references name (the report loads arms without completion texts: one pass per file reads
    only the flipped lines). A line that does not hold the flip's (sample, repeat) gives None, never another text."""
    wanted: dict[str, set[int]] = {}
    refs = {}
    for col in ("baseline_record", "variant_record"):
        refs[col] = [ref.rpartition(":") if isinstance(ref, str) else ("", "", "") for ref in flips[col]]
        for path, _, line in refs[col]:
            if path and line.isdigit():
                wanted.setdefault(path, set()).add(int(line))
    lines: dict[tuple[str, int], dict] = {}
    for path, numbers in wanted.items():
        try:
            with open(path, encoding="utf-8") as fh:
                for i, text in enumerate(fh, 1):
                    if i in numbers:
                        try:
                            lines[(path, i)] = json.loads(text)
                        except ValueError:
                            pass
        except OSError:
            continue
    out = flips.copy()
    for col, side in (("baseline_record", "baseline"), ("variant_record", "variant")):
        texts = []
        for (path, _, line), sid, rep in zip(refs[col], flips["sample_id"], flips["repeat"]):
            rec = lines.get((path, int(line))) if line.isdigit() else None
            ok = rec is not None and (rec.get("sample_id"), rec.get("repeat")) == (sid, int(rep))
            texts.append(rec.get("completion") if ok else None)
        out[f"{side}_completion"] = pd.Series(texts, index=out.index, dtype=object)
    return out


# --- per-arm numbers for the figures -----------------------------------------------------------------
def arm_table(arms: list[Arm]) -> pd.DataFrame:
    """Every arm's score overall and per group from its own scored records (the bars and bands)."""
    rows = []
    for arm in sorted(arms, key=lambda a: (a.model, a.task, a.label)):
        recs = [r.data for r in arm.records]
        for group, n in [("all", group_numbers(recs)), *grouped(recs).items()]:  # metrics: one truth
            rows.append({
                "model": arm.model, "task": arm.task, "arm": arm.label, "kv": arm.kv,
                "fingerprint": arm.fingerprint[:12], "group": group,
                "score": _nan(n["score"]), "stderr": _nan(n["stderr"]),
                "n": n["n_scored"], "n_samples": n["n_samples"], "n_repeats": n["n_repeats"],
                "cutoff_rate": _nan(n["length_cutoff_rate"]),
                "n_skipped": n["n_skipped"], "n_errors": n["n_errors"],
                "records": str(arm.records_path),
            })
    return pd.DataFrame(rows)


def cell_table(arm: Arm) -> pd.DataFrame:
    """Mean score of an arm per cell (all its labels together), for needle heatmaps."""
    rows = [{"groups": tuple(r.data.get("groups") or ()), "score": float(r.data["score"])}
            for r in arm.records if is_scored(r.data)]
    return pd.DataFrame(rows, columns=["groups", "score"])
