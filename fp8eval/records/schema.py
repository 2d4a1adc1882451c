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
    """Why a parsed JSON value is not a valid record (None when it is one). (`type(x) is int` also keeps
    booleans out; it is the reader's hot loop, hence the plain checks.)"""
    if type(obj) is not dict:
        return f"a JSON {type(obj).__name__}, not an object"
    try:
        schema, arm, task, sid, repeat, status = (obj["schema"], obj["arm"], obj["task"], obj["sample_id"],
                                                   obj["repeat"], obj["status"])
    except KeyError:
        return "missing " + ", ".join(k for k in REQUIRED_FIELDS if k not in obj)
    if type(schema) is not int or schema not in SUPPORTED_SCHEMAS:
        return f"schema {schema!r} is not a supported record schema ({', '.join(map(str, SUPPORTED_SCHEMAS))})"
    if type(arm) is not str or not arm:
        return f"arm {arm!r} is not a non-empty string"
    if type(task) is not str or not task:
        return f"task {task!r} is not a non-empty string"
    if type(sid) is not str and type(sid) is not int:
        return f"sample_id {sid!r} is not a string or integer"
    if type(repeat) is not int or repeat < 0:
        return f"repeat {repeat!r} is not a non-negative integer"
    if status not in STATUSES:
        return f"status {status!r} is not one of {', '.join(STATUSES)}"
    score = obj.get("score")
    if status == "ok" or score is not None:
        t = type(score)
        if (t is not float and t is not int) or not math.isfinite(score) or (
                score_range is not None and not score_range[0] <= score <= score_range[1]):
            return f"status {status} with {score_problem(score, score_range)}"
    for key in _COUNTS:
        v = obj.get(key)
        if v is not None and (type(v) is not int or v < 0):
            return f"{key} {v!r} is not a non-negative integer"
    lat = obj.get("latency_s")
    if lat is not None and ((type(lat) is not float and type(lat) is not int) or not math.isfinite(lat) or lat < 0):
        return f"latency_s {lat!r} is not a non-negative finite number"
    seed = obj.get("seed")
    if seed is not None and type(seed) is not int:
        return f"seed {seed!r} is not an integer"
    groups = obj.get("groups")
    if groups is not None and (type(groups) is not list or any(type(g) is not str for g in groups)):
        return f"groups {groups!r} is not a list of strings"
    for key in ("time", "prompt_hash"):
        v = obj.get(key)
        if v is not None and type(v) is not str:
            return f"{key} {v!r} is not a string"
    return None


def check_record(obj: Any, score_range: tuple[float, float] | None = DEFAULT_SCORE_RANGE) -> None:
    """Raise RecordError (one line) when `obj` is not a valid record (what the writer calls)."""
    why = record_problem(obj, score_range)
    if why:
        sid = obj.get("sample_id") if isinstance(obj, dict) else None
        rep = obj.get("repeat") if isinstance(obj, dict) else None
        raise RecordError(f"refusing to write the record of ({sid!r}, {rep!r}): {why}")
