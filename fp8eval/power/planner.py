"""The power plan of one task: variance (pilot or prior), the target, the planned run's MDE, what is needed,
and the cost of the powered run (the dry-run estimator, `fp8eval.plan`)."""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from hydra import compose
from omegaconf import OmegaConf

from fp8eval.core.errors import Fp8evalError
from fp8eval.metrics import power as pw
from fp8eval.metrics.verdict import run_variance
from fp8eval.plan import estimate
from fp8eval.power.priors import PRIORS, prior_for, prior_range
from fp8eval.report.analysis import build_pairs, cluster_of
from fp8eval.report.load import load_runs
from fp8eval.runner import effective_sampling
from fp8eval.tasks import REGISTRY, task_class


class PowerError(Fp8evalError):
    """The power question cannot be answered as asked; the message says why."""


@dataclass
class TaskPlan:
    task: str
    variance: pw.Variance
    baseline_score: float
    baseline_source: str
    delta: float  # score units (0-1)
    target: str
    samples: int  # planned clusters
    repeats: int
    samples_source: str
    mde: float  # of the planned run, score units
    samples_needed: int
    repeats_needed: int | None
    pilot: dict = field(default_factory=dict)
    cost: dict = field(default_factory=dict)
    samples_needed_range: tuple[int, int] | None = None  # from the pilot's (or the prior's) uncertainty
    mde_range: tuple[float, float] | None = None  # of the planned run, score units
    allocation: str = ""  # whether more questions beat more repeats here


def pilot_pairs(paths: list[str], model: str, task: str) -> tuple[list[tuple[str, float, float]], dict]:
    """Paired records `(cluster, baseline, variant)` of `task` on `model` from the runs under `paths`
    (every baseline/variant pair found is pooled), and what was read."""
    roots = [Path(p).expanduser() for p in paths]
    missing = [str(p) for p in roots if not p.exists()]
    if missing:
        raise PowerError(f"pilot path(s) not found: {', '.join(missing)}")
    runs, _ = load_runs(roots)
    pairs, refused = build_pairs([r for r in runs if r.task == task and r.model == model], strict=False)
    clus = cluster_of(task)
    out, samples = [], set()
    for p in pairs:
        for s, g, b, v in zip(p.paired["sample_id"], p.paired["groups"], p.paired["b_score"], p.paired["v_score"]):
            out.append((f"{p.variant.fingerprint[:8]}:{clus(s, tuple(g))}", float(b), float(v)))
            samples.add((p.variant.fingerprint, s))
    clusters = len({c for c, _, _ in out})
    return out, {"runs": len(runs), "pairs_of_arms": [f"{p.baseline.label} vs {p.variant.label}" for p in pairs],
                 "records": len(out), "refused": refused,
                 "samples_per_cluster": len(samples) / clusters if clusters else 1.0}


def planned_samples(cfg) -> tuple[int | None, str]:
    """Samples of the configured task (its grid, data size and limit), without loading data."""
    task = cfg.task
    if cfg.power.samples:
        return int(cfg.power.samples), "power.samples"
    est = estimate(cfg, {"max_tokens": 0})
    if est.requests_per_arm:
        return int(est.requests_per_arm), "the task's grid (fp8eval.plan)"
    n = prior_for(task.name).samples if task.name in PRIORS else None
    if n is None:
        return None, "unknown"
    if task.limit:
        n = min(n, int(task.limit))
    return n, "the dataset's size" + (" and task.limit" if task.limit else "")


def plan_task(cfg) -> TaskPlan:
    """The power plan of the configured task (cfg: PowerRunConfig with a task, no suite)."""
    p = cfg.power
    task = cfg.task.name
    info: dict = {}
    pairs = []
    if p.pilot:
        pairs, info = pilot_pairs(list(p.pilot), cfg.model.name, task)
    if len({c for c, _, _ in pairs}) >= 2:
        var = pw.variance_from_pairs(pairs, f"pilot: {info['records']} paired records of {task} on {cfg.model.name}")
        if not var.binary:  # no variance floor of flips: the pilot's CI floor (an all-ties pilot is not exact)
            var = dataclasses.replace(var, floor=run_variance(pairs).floor)
        span = pw.variance_range(pairs)
        base, base_src = sum(b for _, b, _ in pairs) / len(pairs), "pilot"
    else:
        try:
            prior = prior_for(task)
        except KeyError as e:
            raise PowerError(str(e).strip("'\"")) from None
        var, base, base_src = prior.variance, prior.baseline_score, "prior"
        span = prior_range(prior)
        if p.pilot:
            info["note"] = f"no paired records of {task} on {cfg.model.name} under {', '.join(p.pilot)}: priors used"
    if p.baseline_score is not None:
        base, base_src = float(p.baseline_score), "power.baseline_score"
    if (p.delta is None) == (p.recovery_floor is None):
        raise PowerError("give exactly one target: power.delta=<points of score> or power.recovery_floor=<recovery %>")
    if p.delta is not None:
        if not 0 < float(p.delta) <= 100:
            raise PowerError(f"power.delta is a drop in points of score in (0, 100], got {p.delta}")
        delta, target = float(p.delta) / 100.0, f"a drop of {float(p.delta):g} points"
    else:
        floor = float(p.recovery_floor)
        if not 0 < floor < 100:
            raise PowerError(f"power.recovery_floor is a recovery % in (0, 100), got {floor}")
        delta = (1 - floor / 100.0) * base
        target = (f"recovery {floor:g} % (a drop of {100 * delta:.2f} points on a baseline score of {base:.3f},"
                  f" {base_src})")
    n, n_src = planned_samples(cfg)
    k = int(p.repeats or cfg.task.repeats)
    if n is None:
        raise PowerError(f"the number of samples of {task} is unknown without its data; say power.samples=<n>")
    greedy = float(effective_sampling(cfg).get("temperature") or 0.0) == 0.0
    # A cluster of m samples (NIAH cells, from the pilot) holds m x k records: the formulas count clusters.
    m = float(info.get("samples_per_cluster") or 1.0) if "samples_per_cluster" in info and pairs else 1.0
    clusters, k_eff = n / m, k * m
    needed = math.ceil(pw.clusters_needed(var, delta, k_eff, p.alpha, p.power) * m)
    k_needed = None if greedy else pw.repeats_needed(var, delta, clusters, p.alpha, p.power)
    more_k = None if k_needed is None else max(1, math.ceil(k_needed / m))
    if greedy:
        info["repeats"] = "greedy sampling: a repeat is the same answer again, so only samples add information"
    rng = tuple(math.ceil(pw.clusters_needed(v, delta, k_eff, p.alpha, p.power) * m) for v in span)
    mdes = tuple(pw.mde(v, clusters, k_eff, p.alpha, p.power) for v in span)
    return TaskPlan(task, var, base, base_src, delta, target, n, k, n_src,
                    pw.mde(var, clusters, k_eff, p.alpha, p.power), needed, more_k, info, _cost(cfg, n, k, needed),
                    (min(rng), max(rng)), (min(mdes), max(mdes)), allocation(var, n, k, p.alpha, p.power, greedy, task))


def allocation(var: pw.Variance, n: int, k: int, alpha: float, power: float, greedy: bool, task: str = "") -> str:
    """Whether more questions beat more repeats: at the same n x k generations, fewer repeats on more questions
    against the plan (Var = (omega2 + sigma2_w / k) / n: only questions shrink omega2's part)."""
    if greedy:
        return "greedy: only more questions help (a repeat is the same answer)"
    if var.omega2 <= 0 or k < 2:
        return "" if k < 2 else "omega2 = 0 here: questions and repeats buy the same at the same generations"
    fewer = max(1, k // 2)
    wider = n * k / fewer
    now, alt = pw.mde(var, n, k, alpha, power), pw.mde(var, wider, fewer, alpha, power)
    pool = " (the dataset has no more: task=aime pools AIME 2022-2025)" if task in ("aime24", "aime25") else ""
    return (f"more questions beat more repeats: at the same {n * k} generations, {wider:.0f} questions x {fewer}"
            f" repeats detect {100 * alt:.2f} points where {n} x {k} detect {100 * now:.2f} (omega2"
            f" {var.omega2:.4g} shrinks only with questions){pool}")


def _cost(cfg, planned: int, k: int, needed: int) -> dict:
    """The dry-run estimator's numbers for the planned run, scaled to the needed samples."""
    est = estimate(cfg, effective_sampling(cfg))
    scale = needed / planned if planned else math.nan
    hours = est.hours_per_arm(cfg.plan.prefill_tok_s, cfg.plan.decode_tok_s)
    varies = cfg.task.name in REGISTRY and task_class(cfg.task.name).prompt_varies_by_repeat
    requests = (math.ceil(est.requests_per_arm * scale) if est.requests_per_arm is not None
                else needed * (k if varies else 1))  # one request per prompt; repeats share it unless it varies
    out = {"arms": est.arms, "scale": round(scale, 3), "source": est.source,
           "requests_per_arm": requests,
           "prefill_tokens_per_arm": None if est.prefill_tokens_per_arm is None else est.prefill_tokens_per_arm * scale,
           "gpu_hours": None if hours is None else hours * scale * est.arms * (est.gpus or 1),
           "throughput_source": cfg.plan.throughput_source}
    return out


def plan_all(cfg) -> list[TaskPlan]:
    """One plan per task: the configured task, or each task of the suite composed as `task=<name>`."""
    if cfg.suite is None:
        return [plan_task(cfg)]
    out = []
    for name in cfg.suite.tasks:
        sub = copy.deepcopy(cfg)
        sub.task = OmegaConf.to_object(compose(config_name="power", overrides=[f"task={name}"]).task)
        sub.suite = None
        out.append(plan_task(sub))
    return out


def format_plans(plans: list[TaskPlan], alpha: float, power: float) -> str:
    """The answer as printed: one block per task."""
    lines = [f"power plan: alpha {alpha:g} two-sided, power {power:g}; paired per-record differences, clusters"
             " = samples (NIAH: cells); formulas in docs/statistics.md"]
    for t in plans:
        v = t.variance
        lines += ["", f"{t.task}: target {t.target}",
                  f"  variance: omega2 {v.omega2:.4g} (between samples), sigma2_w {v.sigma2_w:.4g} (within, across"
                  f" repeats){', binary scores: one-way flips floor it' if v.binary else ''} [{v.source}]",
                  f"  planned run: {t.samples} samples x {t.repeats} repeats ({t.samples_source}):"
                  f" MDE {100 * t.mde:.2f} points ({100 * t.mde / t.baseline_score:.2f} recovery points)",
                  f"  needed for the target: {t.samples_needed} samples x {t.repeats} repeats"
                  + (f", or {t.samples} samples x {t.repeats_needed} repeats" if t.repeats_needed else
                     ", and no number of repeats on the planned samples reaches it")]
        if t.samples_needed_range:
            lo, hi = t.samples_needed_range
            lines.append(f"  range ({'95 % interval of the pilot' if t.pilot.get('records') else 'the prior'}'s"
                         f" variance): {lo}-{hi} samples needed; the planned run's MDE {100 * t.mde_range[0]:.2f}-"
                         f"{100 * t.mde_range[1]:.2f} points")
        if t.allocation:
            lines.append(f"  {t.allocation}")
        c = t.cost
        if c.get("prefill_tokens_per_arm") is not None:
            gh = "unknown (set plan.prefill_tok_s / plan.decode_tok_s)" if c["gpu_hours"] is None else \
                f"{c['gpu_hours']:.1f} [{c['throughput_source']}]"
            tok = c["prefill_tokens_per_arm"]
            lines.append(f"  cost of the powered run (dry-run estimator x {c['scale']:g}): {c['requests_per_arm']}"
                         f" requests per arm x {c['arms']} arms, prefill "
                         f"{'unknown' if tok is None else f'{tok / 1e6:.2f} M'} tokens per arm, GPU-hours {gh}")
        else:
            lines.append(f"  cost of the powered run: {c['requests_per_arm']} requests per arm x {c['arms']} arms"
                         f" ({t.samples_needed} samples x {t.repeats} repeats); tokens and GPU-hours unknown: the"
                         f" dry-run estimator cannot size {t.task} without its data (set plan.prefill_tokens_per_arm"
                         " / plan.prefill_tok_s, or see `python -m fp8eval experiment=... dry_run=true`)")
        for key in ("note", "repeats"):
            if t.pilot.get(key):
                lines.append(f"  note: {t.pilot[key]}")
    return "\n".join(lines)
