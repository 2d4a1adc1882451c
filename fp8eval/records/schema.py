"""The one validation of a record: used by the writer (`ArmStore.append` refuses to write a bad record), the
reader (a bad line is set aside as `not_a_record`, never counted), `python -m fp8eval.records check` and
`repair` (which move such lines to `.rejected.jsonl`).

A record is a JSON object with a supported `schema`, the identity fields (`arm`, `task`, `sample_id`,
`repeat`, `status`) of the right types, a score that is a finite number inside the task's declared score
range when the status is `ok` (null or such a number otherwise), and token counts / latency that are
non-negative finite numbers or null. `score_range` None means "any finite number" (a task whose metric has
no fixed range, such as an lm-eval metric chosen by the user).
"""

from __future__ import annotations

import math
from typing import Any

from fp8eval.core.errors import Fp8evalError

# 2: seeds are the sample's seed + repeat (fp8eval.seeds), so records seeded otherwise are never reused.
RECORD_SCHEMA = 2
# Schemas this reader understands: 1 (older arms, read by the report) and the current one.
SUPPORTED_SCHEMAS = (1, 2)
# The score range of a task that declares none (every built-in task scores in 0..1).
DEFAULT_SCORE_RANGE = (0.0, 1.0)

# Fields a line must carry to be a record at all (the reader then checks that they match the arm).
REQUIRED_FIELDS = ("schema", "arm", "task", "sample_id", "repeat", "status")
STATUSES = ("ok", "skipped", "error")
_COUNTS = ("prompt_tokens", "output_tokens", "cached_prompt_tokens")


class RecordError(Fp8evalError):
    """A record the writer refuses to write (the message is one line naming the field and value)."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def score_problem(score: Any, score_range: tuple[float, float] | None = DEFAULT_SCORE_RANGE) -> str | None:
    """Why a score is impossible (not a number, NaN/inf, outside the task's range), or None."""
    if not _is_real(score):
        return f"score {score!r} is not a number"
    if not math.isfinite(score):
        return f"score {score!r} is not finite"
    if score_range is not None and not score_range[0] <= score <= score_range[1]:
        return f"score {score!r} is outside the task's score range {score_range[0]:g}..{score_range[1]:g}"
    return None


def record_problem(obj: Any, score_range: tuple[float, float] | None = DEFAULT_SCORE_RANGE) -> str | None:
    """Why a parsed JSON value is not a valid record (None when it is one)."""
    if not isinstance(obj, dict):
        return f"a JSON {type(obj).__name__}, not an object"
    missing = [k for k in REQUIRED_FIELDS if k not in obj]
    if missing:
        return "missing " + ", ".join(missing)
    if not _is_int(obj["schema"]) or obj["schema"] not in SUPPORTED_SCHEMAS:
        return (f"schema {obj['schema']!r} is not a supported record schema "
                f"({', '.join(map(str, SUPPORTED_SCHEMAS))})")
    for key in ("arm", "task"):
        if not isinstance(obj[key], str) or not obj[key]:
            return f"{key} {obj[key]!r} is not a non-empty string"
    if not (isinstance(obj["sample_id"], str) or _is_int(obj["sample_id"])):
        return f"sample_id {obj['sample_id']!r} is not a string or integer"
    if not _is_int(obj["repeat"]) or obj["repeat"] < 0:
        return f"repeat {obj['repeat']!r} is not a non-negative integer"
    if obj["status"] not in STATUSES:
        return f"status {obj['status']!r} is not one of {', '.join(STATUSES)}"
    score = obj.get("score")
    if obj["status"] == "ok" or score is not None:
        why = score_problem(score, score_range)
        if why:
            return f"status {obj['status']} with {why}"
    for key in _COUNTS:
        v = obj.get(key)
        if v is not None and (not _is_int(v) or v < 0):
            return f"{key} {v!r} is not a non-negative integer"
    lat = obj.get("latency_s")
    if lat is not None and (not _is_real(lat) or not math.isfinite(lat) or lat < 0):
        return f"latency_s {lat!r} is not a non-negative finite number"
    if "seed" in obj and obj["seed"] is not None and not _is_int(obj["seed"]):
        return f"seed {obj['seed']!r} is not an integer"
    groups = obj.get("groups")
    if groups is not None and (not isinstance(groups, list) or not all(isinstance(g, str) for g in groups)):
        return f"groups {groups!r} is not a list of strings"
    for key in ("time", "prompt_hash"):
        if obj.get(key) is not None and not isinstance(obj[key], str):
            return f"{key} {obj[key]!r} is not a string"
    return None


def check_record(obj: Any, score_range: tuple[float, float] | None = DEFAULT_SCORE_RANGE) -> None:
    """Raise RecordError (one line) when `obj` is not a valid record (what the writer calls)."""
    why = record_problem(obj, score_range)
    if why:
        sid = obj.get("sample_id") if isinstance(obj, dict) else None
        rep = obj.get("repeat") if isinstance(obj, dict) else None
        raise RecordError(f"refusing to write the record of ({sid!r}, {rep!r}): {why}")
