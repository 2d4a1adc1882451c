"""Inputs checked before any work, each message naming the key, the value and the valid range.

`check_task_config` runs before an engine is built; `check_samples` right after the task loads its data;
`read_jsonl_rows` is how data files are read (a malformed row names file:line, an empty file is an error).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fp8eval.core.errors import InputError

__all__ = ["InputError", "check_task_config", "check_samples", "read_jsonl_rows", "check_audit_config",
           "validate_config", "validate_report_options"]


def _ints(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_task_config(cfg: Any) -> None:
    """repeats >= 1; limit null or >= 1; a grid's lengths >= 1 and depths in 0..100, neither empty."""
    name = getattr(cfg, "name", "?")
    if not _ints(cfg.repeats) or cfg.repeats < 1:
        raise InputError(f"task.repeats={cfg.repeats!r} ({name}): must be an integer >= 1")
    if cfg.limit is not None and (not _ints(cfg.limit) or cfg.limit < 1):
        raise InputError(f"task.limit={cfg.limit!r} ({name}): must be null (every sample) or an integer >= 1")
    lengths = getattr(cfg, "lengths", None)
    if lengths is not None:
        if not list(lengths):
            raise InputError(f"task.lengths=[] ({name}): give at least one length in tokens (>= 1)")
        bad = [x for x in lengths if not _ints(x) or x < 1]
        if bad:
            raise InputError(f"task.lengths={list(lengths)} ({name}): each must be an integer >= 1 (tokens); "
                             f"not {bad}")
    depths = getattr(cfg, "depths", None)
    if depths is not None:
        if not list(depths):
            raise InputError(f"task.depths=[] ({name}): give at least one depth in percent (0..100)")
        bad = [x for x in depths if not isinstance(x, (int, float)) or isinstance(x, bool) or math.isnan(x)
               or not 0 <= x <= 100]
        if bad:
            raise InputError(f"task.depths={list(depths)} ({name}): each must be a percentage in 0..100; not {bad}")
    for key in ("needles", "needles_per_cell", "synthetic_rows"):
        value = getattr(cfg, key, None)
        values = list(value) if isinstance(value, (list, tuple)) or hasattr(value, "__iter__") else [value]
        if value is not None and (not values or any(not _ints(x) or x < 1 for x in values)):
            raise InputError(f"task.{key}={value!r} ({name}): must be integer(s) >= 1")


def check_samples(task_name: str, samples: list, data_files: Iterable[str] | None) -> None:
    """A task with no sample would give an empty table with exit 0: refuse it instead."""
    if not samples:
        where = f" from task.data_files={list(data_files)}" if data_files else ""
        raise InputError(f"task {task_name}: no samples{where}; check the data files and task.limit")


def read_jsonl_rows(lines: Iterable[str], path: Path) -> list[dict]:
    """JSON-object rows of a JSONL text; a bad row names path:line; an empty file is an error."""
    rows = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{i}: malformed row (not JSON: {e})") from None
        if not isinstance(row, dict):
            raise InputError(f"{path}:{i}: malformed row (a JSON {type(row).__name__}, not an object)")
        rows.append(row)
    if not rows:
        raise InputError(f"{path}: no rows (the data file is empty)")
    return rows


AUDIT_CATEGORIES = ("dtype", "scales", "backend", "skip")  # fp8eval.engines.audit.compare.CATEGORIES


def check_audit_config(cfg: Any) -> None:
    """audit.allow names only knob-audit categories (dtype, scales, backend, skip)."""
    allow = list(getattr(getattr(cfg, "audit", None), "allow", None) or [])
    bad = [a for a in allow if a not in AUDIT_CATEGORIES]
    if bad:
        raise InputError(f"audit.allow={allow}: unknown categories {bad}; valid: {', '.join(AUDIT_CATEGORIES)}")


def _section(cfg: Any, key: str) -> Any:
    node = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
        if node is None:
            return None
    return node


def validate_config(cfg: Any) -> None:
    """The one check of a composed config (typed or a plain dict), shared by every wing, before any engine starts:
    every numeric option's type and range (NaN refused; fp8eval.bounds), every name that becomes a path, the task's
    options, and the rules that tie keys together (lengths against model.max_model_len, stop.alpha_cs within
    stats.alpha, pareto's own). Raises InputError, one line naming the key, the value and what is valid."""
    from fp8eval.bounds import all_rules, check_names, check_numbers

    check_numbers(cfg, all_rules())
    check_names(cfg)
    task = _section(cfg, "task")
    if task is not None and hasattr(task, "repeats") and _section(cfg, "suite") is None:
        check_task_config(task)
    if _section(cfg, "audit") is not None:
        check_audit_config(cfg)
    stats_alpha, alpha_cs = _section(cfg, "stats.alpha"), _section(cfg, "stop.alpha_cs")
    if stats_alpha is not None and alpha_cs is not None and alpha_cs >= stats_alpha:
        raise InputError(f"stop.alpha_cs={alpha_cs!r}: must be below stats.alpha={stats_alpha!r} (it is the part "
                         "of stats.alpha the confidence sequence spends)")
    _check_lengths(cfg)


def validate_report_options(options: dict[str, Any]) -> None:
    """python -m fp8eval.report's numeric options ({"--gate": 95.0, ...}), each in its range (InputError)."""
    from fp8eval.bounds import REPORT_RULES, check_numbers

    check_numbers(options, REPORT_RULES)


def _check_lengths(cfg: Any) -> None:
    """A length no passage can have under model.max_model_len refuses the run when every length is such
    (divergence keeps a passage at most max_model_len - 1 tokens, room for the one generated token vLLM needs)."""
    max_len = _section(cfg, "model.max_model_len")
    if not _ints(max_len):
        return
    for key, limit in (("divergence.lengths", max_len - 1), ("sensitivity.lengths", max_len)):
        lengths = _section(cfg, key)
        if lengths is None:
            continue
        lengths = list(lengths)
        if lengths and all(n > limit for n in lengths):
            raise InputError(f"{key}={lengths}: every length is above {limit} tokens (model.max_model_len="
                             f"{max_len}{' - 1' if limit < max_len else ''}); give a length <= {limit} or raise "
                             "model.max_model_len")
