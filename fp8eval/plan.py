"""What a run will cost, before it starts: GPUs, requests, prefill tokens and GPU-hours.

`python -m fp8eval experiment=<preset> dry_run=true` prints this and exits 0 without loading a model or
reading a dataset. Requests and prefill tokens come from the task's configuration where the task's
shape is known without its data (MRCR: 100 rows per bin and needle count, a row of bin (lo, hi] has lo to
hi o200k tokens, docs/mrcr.md; NIAH: the grid), else from the preset's `plan.*` numbers. Time is
tokens / throughput, and the throughput is a number the preset states with its source
(`plan.throughput_source`: measured, with the command, or an assumption, labelled as such).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fp8eval.metrics.auc import MRCR_BINS
from fp8eval.tasks.mrcr.task import selected_buckets

MRCR_ROWS_PER_BIN = 100  # per needle count (the openai/mrcr release; docs/mrcr.md)


@dataclass
class Estimate:
    arms: int
    checkpoints: list[str]
    gpus: int | None
    requests_per_arm: int | None
    samples_per_arm: int | None
    prefill_tokens_per_arm: float | None  # (low, mid, high) collapsed to mid; range in `prefill_range`
    prefill_range: tuple[float, float] | None = None
    decode_tokens_per_arm: float | None = None
    source: str = ""
    notes: list[str] = field(default_factory=list)

    def hours_per_arm(self, prefill_tok_s: float | None, decode_tok_s: float | None) -> float | None:
        """Wall-clock hours of one arm on one engine instance (prefill and decode, not overlapped)."""
        if not prefill_tok_s or self.prefill_tokens_per_arm is None:
            return None
        seconds = self.prefill_tokens_per_arm / prefill_tok_s
        if self.decode_tokens_per_arm:
            if not decode_tok_s:
                return None
            seconds += self.decode_tokens_per_arm / decode_tok_s
        return seconds / 3600.0


def _mrcr(task, max_model_len: int, max_tokens: int) -> tuple[int, float, float, float, list[str]]:
    labels = set(selected_buckets(task))
    bins = [b for b in MRCR_BINS if b.label in labels]
    fit = [b for b in bins if b.lo + max_tokens <= max_model_len]
    notes = []
    if len(fit) < len(bins):
        notes.append(f"bins {', '.join(b.label for b in bins if b not in fit)} cannot fit max_model_len "
                     f"{max_model_len}: their rows will be recorded as skipped, at no prefill cost")
    rows = MRCR_ROWS_PER_BIN * len(task.needles)
    if task.limit:
        rows = min(rows, int(task.limit) * len(task.needles))
    requests = rows * len(fit)
    lo = sum(b.lo for b in fit) * rows
    hi = sum(min(b.hi, max_model_len) for b in fit) * rows
    return requests, (lo + hi) / 2, lo, hi, notes


def _niah(task, max_model_len: int, max_tokens: int) -> tuple[int, float]:
    cap = max_model_len - max_tokens
    lengths = sorted({min(int(n), cap) for n in task.lengths})
    per_length = len(task.depths) * int(task.needles_per_cell)
    return len(lengths) * per_length, float(sum(lengths) * per_length)


def estimate(cfg, sampling: dict) -> Estimate:
    """The cost of the configured run (one checkpoint; `plan.checkpoints` lists the others)."""
    plan = cfg.plan
    arms = 1 if cfg.baseline in (None, "none", "") or cfg.baseline == cfg.kv.name else 2
    control = getattr(cfg, "control", None)
    arms += 1 if arms == 2 and control is not None and control.name not in ("none", "") else 0  # control=<name>
    checkpoints = list(plan.checkpoints) or [cfg.model.name]
    gpus = plan.gpus or int(cfg.model.tensor_parallel_size)
    task = cfg.task
    max_tokens = int(sampling.get("max_tokens") or 0)
    est = Estimate(arms, checkpoints, gpus, plan.requests_per_arm, None, plan.prefill_tokens_per_arm,
                   decode_tokens_per_arm=plan.decode_tokens_per_arm, source="the preset's plan.* numbers")
    if cfg.suite is None and task.name == "mrcr":
        req, mid, lo, hi, notes = _mrcr(task, int(cfg.model.max_model_len), max_tokens)
        est.requests_per_arm, est.prefill_tokens_per_arm, est.prefill_range = req, mid, (lo, hi)
        est.source = ("task config: 100 rows per bin and needle count, each between its bin's bounds "
                      "(o200k tokens; the model's tokenizer counts within ~10%, docs/mrcr.md); midpoint")
        est.notes += notes
    elif cfg.suite is None and task.name == "niah":
        est.requests_per_arm, est.prefill_tokens_per_arm = _niah(task, int(cfg.model.max_model_len), max_tokens)
        est.source = "task config: lengths x depths x needles_per_cell, each prompt its grid length"
    if est.requests_per_arm is not None and cfg.suite is None:
        est.samples_per_arm = est.requests_per_arm * int(task.repeats)
    return est


def _tok(x: float | None) -> str:
    if x is None:
        return "unknown"
    return f"{x / 1e9:.2f} B" if x >= 1e9 else f"{x / 1e6:.1f} M" if x >= 1e5 else f"{x:,.0f}"


def format_plan(cfg, sampling: dict) -> str:
    """The plan as printed before a preset starts and by dry_run=true."""
    est = estimate(cfg, sampling)
    plan = cfg.plan
    what = f"suite {cfg.suite.name}" if cfg.suite is not None else f"task {cfg.task.name}"
    runs = len(est.checkpoints)
    lines = [(f"plan: {what}, kv {cfg.kv.name} vs {cfg.baseline}: {est.arms} arm(s) x {runs} checkpoint(s) "
              f"({', '.join(est.checkpoints)})"),
             (f"  GPUs: {est.gpus or 'unknown'} per engine instance (tensor_parallel_size "
              f"{cfg.model.tensor_parallel_size}); shards or replicas multiply throughput, not this")]
    req = est.requests_per_arm
    lines.append(f"  requests per arm: {req if req is not None else 'unknown'}"
                 + (f" ({est.samples_per_arm} samples; the n={cfg.task.repeats} repeats of a request share one prefill)"
                    if est.samples_per_arm else ""))
    rng = (f" (range {_tok(est.prefill_range[0])} - {_tok(est.prefill_range[1])})" if est.prefill_range else "")
    lines.append(f"  prefill tokens per arm: {_tok(est.prefill_tokens_per_arm)}{rng}; all arms and checkpoints: "
                 f"{_tok(est.prefill_tokens_per_arm * est.arms * runs) if est.prefill_tokens_per_arm else 'unknown'}")
    lines.append(f"    from {est.source}")
    if est.decode_tokens_per_arm:
        lines.append(f"  decode tokens per arm: {_tok(est.decode_tokens_per_arm)} (preset's estimate)")
    hours = est.hours_per_arm(plan.prefill_tok_s, plan.decode_tok_s)
    thr = (f"prefill {plan.prefill_tok_s:,.0f} tok/s" if plan.prefill_tok_s else "prefill throughput unset") + (
        f", decode {plan.decode_tok_s:,.0f} tok/s" if plan.decode_tok_s else "")
    lines.append(f"  throughput per engine instance: {thr} [{plan.throughput_source}]")
    if hours is None:
        lines.append("  GPU-hours: unknown (set plan.prefill_tok_s / plan.decode_tok_s to a measured number)")
    else:
        total = hours * est.arms * runs
        lines.append(f"  wall time on one instance: {hours:.1f} h per arm, {total:.1f} h in all; GPU-hours: "
                     f"{total * (est.gpus or 1):.1f} (x{est.gpus or 1} GPUs); N shards or replicas divide the "
                     "wall time by about N")
    for n in est.notes + ([plan.notes] if plan.notes else []):
        lines.append(f"  note: {n}")
    return "\n".join(lines)
