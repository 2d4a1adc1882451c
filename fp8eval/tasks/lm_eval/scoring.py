"""From lm-eval requests to fp8eval prompts, and from one completion back to lm-eval's metrics.

Scoring a (document, repeat) is pure: fresh copies of the document's Instances get the completion as their
only response, the task's filter ensembles run on those copies, and the task's process_results turns each
filter's output into metrics, exactly what lm-eval's evaluate() does for a run with one repeat.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

from fp8eval.core.types import decode_loglikelihoods
from fp8eval.tasks.base import Prompt, Score
from fp8eval.tasks.lm_eval.bridge import LmEvalError

# lm-eval generation kwargs -> fp8eval sampling keys (after lm-eval's own normalize_gen_kwargs).
_SAMPLING_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                  "repetition_penalty": "repetition_penalty", "presence_penalty": "presence_penalty"}


def sampling_from(gen_kwargs: dict) -> dict:
    """A task's generation_kwargs as fp8eval sampling: until -> stop, max_gen_toks -> max_tokens, greedy when
    do_sample is false (lm-eval's rule). A key fp8eval cannot honour fails rather than being dropped."""
    from lm_eval.models.utils import normalize_gen_kwargs

    g = dict(normalize_gen_kwargs(dict(gen_kwargs or {}), default_max_gen_toks=256))
    out: dict[str, Any] = {"stop": [s for s in g.pop("until", []) if s], "max_tokens": int(g.pop("max_gen_toks"))}
    g.pop("do_sample", None)
    for k, ours in _SAMPLING_KEYS.items():
        if k in g:
            out[ours] = g.pop(k)
    if g:
        raise LmEvalError(f"lm-eval generation_kwargs {sorted(g)} have no fp8eval sampling equivalent (supported: "
                          f"until, max_gen_toks, do_sample, {', '.join(_SAMPLING_KEYS)})")
    return out


def prompt(instances: list, chat: bool) -> Prompt:
    """The fp8eval prompt of one lm-eval document."""
    first = instances[0]
    if first.request_type == "generate_until":
        ctx, gen_kwargs = first.args[0], first.args[1]
        sampling = sampling_from(gen_kwargs)
        if chat:  # bridge._messages_as_json rendered the messages; the engine applies the model's template
            return Prompt(messages=tuple(json.loads(ctx)), sampling=sampling)
        return Prompt(messages=({"role": "user", "content": ctx},), prompt_text=ctx, sampling=sampling)
    pairs = tuple((str(i.args[0]), str(i.args[1])) for i in instances)
    # prompt_text is what the runner counts against max_model_len: the longest pair, whole.
    longest = max((c + x for c, x in pairs), key=len)
    return Prompt(messages=({"role": "user", "content": longest},), prompt_text=longest, logprob_pairs=pairs)


def filter_names(task) -> list[str]:
    """The names of an lm-eval task's filters, in order."""
    return [f.name for f in task._filters]


def primary_key(task, metric: str | None, doc: Any = None, doc_groups: tuple[str, ...] = ("max_length",)) -> str:
    """The "metric,filter" a record's score is: `metric` when given (the first filter when it names none),
    else the task's first metric under its first filter; a per-length metric named after the document's
    length (RULER's "4096") is that document's score."""
    metrics, filters = list(task.aggregation()), filter_names(task)
    if metric:
        name, _, filt = metric.partition(",")
        filt = filt or filters[0]
        if name not in metrics or filt not in filters:
            raise LmEvalError(f"task.metric={metric!r} is not one of {task.config.task}'s: "
                              + ", ".join(f"{m},{f}" for f in filters for m in metrics))
        return f"{name},{filt}"
    if isinstance(doc, dict):
        for k in doc_groups:
            if str(doc.get(k)) in metrics:
                return f"{doc[k]},{filters[0]}"
    return f"{metrics[0]},{filters[0]}"


def aggregation_name(task, metric: str) -> str:
    """The name of the aggregation function an lm-eval task uses for `metric` (e.g. 'mean')."""
    fn = task.aggregation().get(metric)
    return getattr(fn, "__name__", str(fn))


def score(task, instances: list, completion: str, metric: str | None,
          doc_groups: tuple[str, ...] = ("max_length",)) -> Score:
    """lm-eval's filters and process_results on one completion of one document."""
    from lm_eval.api.instance import Instance

    if instances[0].request_type == "generate_until":
        resps = [[completion]]
    else:
        pairs = decode_loglikelihoods(completion)
        if len(pairs) != len(instances):
            raise ValueError(f"{len(pairs)} loglikelihoods for {len(instances)} requests")
        resps = [[tuple(p)] for p in pairs]
    copies = [Instance(request_type=i.request_type, doc=i.doc, arguments=i.arguments, idx=i.idx,
                       metadata=(i.task_name, i.doc_id, i.repeats), resps=r) for i, r in zip(instances, resps)]
    for ensemble in task._filters:
        ensemble.apply(copies)
    doc = instances[0].doc
    metrics: dict[str, Any] = {}
    for key in filter_names(task):
        for m, v in task.process_results(doc, [c.filtered_resps[key] for c in copies]).items():
            metrics[f"{m},{key}"] = _jsonable(v)
    primary = primary_key(task, metric, doc, doc_groups)
    value = metrics.get(primary)
    if not isinstance(value, (int, float)):
        numeric = [k for k, v in metrics.items() if isinstance(v, (int, float))]
        raise LmEvalError(f"{task.config.task}: metric {primary} is {value!r} for a document, not a number; choose a "
                          f"per-document metric with task.metric (numeric here: {', '.join(numeric) or 'none'})")
    filt = primary.split(",", 1)[1]
    return Score(value=float(value), extracted=_short(copies[0].filtered_resps[filt]),
                 details={"metric": primary, "metrics": metrics})


def aggregate(tasks: dict, records: list[dict]) -> dict[str, dict[str, float | None]]:
    """Each task's metrics over the arm's scored records, aggregated as lm-eval aggregates them."""
    values: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.get("status") != "ok":
            continue
        name = r["sample_id"].rsplit(":", 1)[0]
        for key, v in ((r.get("score_details") or {}).get("metrics") or {}).items():
            values[name][key].append(v)
    out: dict[str, dict[str, float | None]] = {}
    for name, task in tasks.items():
        fns = task.aggregation()
        out[name] = {}
        for key, vs in sorted(values.get(name, {}).items()):
            fn = fns.get(key.split(",", 1)[0])
            try:
                v = float(fn(vs)) if fn else None
            except (TypeError, ValueError, ZeroDivisionError):
                v = None
            out[name][key] = v if v is None or math.isfinite(v) else None
    return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, bool):
        return float(v)
    if hasattr(v, "item") and not isinstance(v, (list, tuple, dict)):
        return v.item()  # numpy scalars
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    return v


def _short(x: Any, n: int = 200) -> str:
    s = x if isinstance(x, str) else json.dumps(x, default=str)
    return s if len(s) <= n else s[:n] + "…"
