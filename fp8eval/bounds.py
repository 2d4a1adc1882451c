"""Every numeric option of the runner, plan, divergence and perf configs checked before any work, and every
name that becomes part of a path (model, kv, task, suite names) checked to stay one path component.

One rule per dotted key (`Rule`): type (int or real), range, optional (null allowed), list (each element,
and whether it may be empty). A violation is one line naming the key, the value and the valid range
(`InputError`, exit 2 in the CLIs).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from fp8eval.core.errors import InputError


@dataclass(frozen=True)
class Rule:
    """key: dotted path; kind: int | real; lo/hi: bounds (inclusive unless *_open); optional: null allowed;
    each: a list whose elements obey the rule (nonempty: at least one); increasing: strictly increasing."""

    key: str
    kind: str = "int"
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    optional: bool = False
    each: bool = False
    nonempty: bool = True
    increasing: bool = False

    def valid(self) -> str:
        """The valid range in words."""
        lo = "" if self.lo is None else f"{'>' if self.lo_open else '>='} {self.lo:g}"
        hi = "" if self.hi is None else f"{'<' if self.hi_open else '<='} {self.hi:g}"
        kind = "an integer" if self.kind == "int" else "a finite number"
        rng = " and ".join(x for x in (lo, hi) if x)
        return f"{kind}{' ' + rng if rng else ''}"

    def problem(self, x: Any) -> bool:
        """True when one value breaks the rule."""
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return True
        if self.kind == "int" and not isinstance(x, int):
            return True
        if isinstance(x, float) and not math.isfinite(x):
            return True
        if self.lo is not None and (x <= self.lo if self.lo_open else x < self.lo):
            return True
        return self.hi is not None and (x >= self.hi if self.hi_open else x > self.hi)


def _sampling(prefix: str) -> list[Rule]:
    return [Rule(f"{prefix}.temperature", "real", lo=0, optional=True),
            Rule(f"{prefix}.top_p", "real", lo=0, hi=1, lo_open=True, optional=True),
            Rule(f"{prefix}.top_k", "int", lo=-1, optional=True),
            Rule(f"{prefix}.min_p", "real", lo=0, hi=1, optional=True),
            Rule(f"{prefix}.max_tokens", "int", lo=1, optional=True),
            Rule(f"{prefix}.presence_penalty", "real", lo=-2, hi=2, optional=True),
            Rule(f"{prefix}.repetition_penalty", "real", lo=0, lo_open=True, optional=True)]


ENGINE_RULES = [
    Rule("model.max_model_len", lo=1), Rule("model.tensor_parallel_size", lo=1),
    Rule("engine.threads", lo=1, optional=True), Rule("engine.prefill_chunk", lo=1),
    Rule("engine.fail_after", lo=0, optional=True), Rule("engine.concurrency", lo=1),
    Rule("engine.max_retries", lo=0), Rule("engine.startup_timeout_s", "real", lo=0, lo_open=True),
    *_sampling("model.sampling"),
]
RUN_RULES = [
    *ENGINE_RULES, *_sampling("sampling"), *_sampling("task.sampling"), Rule("seed"),
    Rule("scoring_workers", lo=0, optional=True), Rule("records_commit_s", "real", lo=0, hi=60),
    Rule("plan.gpus", lo=1, optional=True), Rule("plan.requests_per_arm", lo=1, optional=True),
    Rule("plan.prefill_tokens_per_arm", "real", lo=0, optional=True),
    Rule("plan.decode_tokens_per_arm", "real", lo=0, optional=True),
    Rule("plan.prefill_tok_s", "real", lo=0, lo_open=True, optional=True),
    Rule("plan.decode_tok_s", "real", lo=0, lo_open=True, optional=True),
]
DIVERGENCE_RULES = [
    *ENGINE_RULES, Rule("seed"),
    # a passage is BOS plus at least one token whose next-token distribution is compared
    # documents=0 measures only divergence.texts (the run refuses when there are none either)
    Rule("divergence.lengths", lo=2, each=True), Rule("divergence.documents", lo=0),
    Rule("divergence.topk", lo=1), Rule("divergence.edges", lo=0, each=True, increasing=True),
    Rule("divergence.batch", lo=1), Rule("divergence.prompt_tokens", lo=1),
]
PERF_RULES = [
    *ENGINE_RULES, Rule("seed"),
    Rule("perf.lengths", lo=1, each=True, optional=True), Rule("perf.sweep_points", lo=1),
    Rule("perf.min_input", lo=1), Rule("perf.max_input", lo=1, optional=True),
    Rule("perf.sweep_output_tokens", lo=1), Rule("perf.sweep_requests", lo=1), Rule("perf.warmup_requests", lo=0),
    Rule("perf.throughput_requests", lo=1), Rule("perf.throughput_concurrency", lo=1),
    Rule("perf.throughput_input", lo=1), Rule("perf.throughput_output", lo=1),
    Rule("perf.throughput_jitter", "real", lo=0, hi=1, hi_open=True),
    Rule("perf.vocab_size", lo=1, optional=True), Rule("perf.request_timeout_s", "real", lo=0, lo_open=True),
]

def _unit(key: str, *, hi_open: bool = True, optional: bool = False) -> Rule:
    """A probability-like number strictly between 0 and 1 (1 allowed when not hi_open)."""
    return Rule(key, "real", lo=0, hi=1, lo_open=True, hi_open=hi_open, optional=optional)


# The statistics' inputs (their meaning is fp8eval.metrics'): only ranges here.
STATS_RULES = [
    Rule("stats.gate", "real", lo=0, hi=100, lo_open=True), _unit("stats.alpha"), _unit("stats.power"),
    _unit("stats.right_at", hi_open=False),  # a record is right when its score (0..1) reaches it: 0 makes all right
    Rule("stop.round_size", lo=1), _unit("stop.alpha_cs"), _unit("stop.cap"),
]
POWER_RULES = [
    Rule("power.delta", "real", lo=0, hi=100, lo_open=True, optional=True),
    Rule("power.recovery_floor", "real", lo=0, hi=100, lo_open=True, hi_open=True, optional=True),
    _unit("power.alpha"), _unit("power.power"), Rule("power.samples", lo=1, optional=True),
    Rule("power.repeats", lo=1, optional=True), _unit("power.baseline_score", hi_open=False, optional=True),
]
PARETO_RULES = [
    Rule("pareto.max_kl", "real", lo=0, optional=True),
    Rule("pareto.min_recovery", "real", lo=0, hi=100, lo_open=True, optional=True),
    Rule("pareto.survivors", lo=1), Rule("pareto.prefill_chunk", lo=1, optional=True),
    Rule("divergence.batch", lo=1),
]
SENSITIVITY_RULES = [
    Rule("sensitivity.lengths", lo=2, each=True), Rule("sensitivity.documents", lo=1),
    Rule("sensitivity.target", "real", lo=0, hi=1, lo_open=True), Rule("sensitivity.refine", lo=0),
    Rule("sensitivity.edges", lo=0, each=True, increasing=True), Rule("sensitivity.cache_logits_gib", "real", lo=0),
]
CALIBRATE_RULES = [Rule("calib.samples", lo=1), Rule("calib.seq_len", lo=1), Rule("calib.seed"),
                   Rule("calib.threads", lo=1, optional=True)]
# python -m fp8eval.report's options (named as typed on its command line).
REPORT_RULES = [
    Rule("--gate", "real", lo=0, hi=100, lo_open=True), Rule("--level", "real", lo=0, hi=1, lo_open=True, hi_open=True),
    Rule("--unsure-margin", "real", lo=0), Rule("--sign-alpha", "real", lo=0, hi=1, lo_open=True, hi_open=True),
    Rule("--right-at", "real", lo=0, hi=1, lo_open=True), Rule("--z", "real", lo=0, lo_open=True),
    Rule("--n-boot", lo=1), Rule("--shift-margin", "real", lo=0),
]


def all_rules() -> list[Rule]:
    """Every wing's rules, one per key (a key absent from a wing's config is skipped by `check_numbers`)."""
    seen: dict[str, Rule] = {}
    for rule in (*RUN_RULES, *DIVERGENCE_RULES, *PERF_RULES, *STATS_RULES, *POWER_RULES, *PARETO_RULES,
                 *SENSITIVITY_RULES, *CALIBRATE_RULES):
        seen.setdefault(rule.key, rule)
    return list(seen.values())


_MISSING = object()


def _get(cfg: Any, key: str) -> Any:
    node = cfg
    for part in key.split("."):
        if node is None:
            return _MISSING
        node = node.get(part, _MISSING) if isinstance(node, dict) else getattr(node, part, _MISSING)
        if node is _MISSING:
            return _MISSING
    return node


def check_numbers(cfg: Any, rules: list[Rule]) -> None:
    """Raise InputError (one line) at the first option that breaks its rule; keys absent from cfg are skipped."""
    for rule in rules:
        value = _get(cfg, rule.key)
        if value is _MISSING or (value is None and rule.optional):
            continue
        if rule.each:
            values = list(value) if isinstance(value, (list, tuple)) or hasattr(value, "__iter__") else None
            if values is None or (rule.nonempty and not values):
                raise InputError(f"{rule.key}={value!r}: give a list of at least one value, each {rule.valid()}")
            bad = [x for x in values if rule.problem(x)]
            if bad:
                raise InputError(f"{rule.key}={values}: each must be {rule.valid()}; not {bad}")
            if rule.increasing and any(b <= a for a, b in zip(values, values[1:])):
                raise InputError(f"{rule.key}={values}: must be strictly increasing")
        elif value is None or rule.problem(value):
            raise InputError(f"{rule.key}={value!r}: must be {rule.valid()}"
                             + (" or null" if rule.optional else ""))


# A name that becomes a path component: no separator, no "..", nothing hidden, printable.
_SAFE = re.compile(r"^[A-Za-z0-9_+][A-Za-z0-9._+=@,-]*$")
NAME_KEYS = ("model.name", "kv.name", "task.name", "suite.name")


def name_problem(value: Any) -> str | None:
    """Why a name cannot be one path component (None when it can)."""
    if not isinstance(value, str) or not _SAFE.match(value) or ".." in value or len(value) > 200:
        return (f"{value!r} cannot name a directory: use letters, digits and . _ + = @ , - (no '/', no '..', "
                "not starting with '.' or '-')")
    return None


def check_names(cfg: Any, keys: tuple[str, ...] = NAME_KEYS) -> None:
    """Raise InputError when a name that becomes part of a run or records path could escape it."""
    for key in keys:
        value = _get(cfg, key)
        if value is _MISSING or value is None:
            continue
        why = name_problem(value)
        if why:
            raise InputError(f"{key}={why}")
