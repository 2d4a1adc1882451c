"""records.parquet: every record of every arm with its prompt and completion, one row per (arm, sample, repeat).

Records keep a prompt hash, never the prompt (a store shared by many runs stays small); the prompt text comes
from the run's own plan: the task built every (sample, repeat)'s prompt deterministically before sending, and
a row gets it only when the plan's prompt hash equals the record's (`prompt_source`: "plan"), else it stays
empty ("not in this run's plan": a store that holds a larger grid than this run). `export.texts=false` leaves
out every text (prompt, completion, reasoning, extracted answer) and keeps hashes, scores and counts.
"""

from __future__ import annotations

import json
from pathlib import Path

TEXT_COLUMNS = ("prompt", "prompt_messages", "completion", "reasoning", "extracted")
_NESTED = ("sampling", "score_details")  # JSON strings in the table (their keys vary by task)


def prompt_columns(prompt) -> dict:
    """The prompt as text (the task's raw prompt, else the messages as plain text, else the scoring contexts)
    and its messages as JSON."""
    from fp8eval.engines.prompting import plain_prompt_text

    if prompt.prompt_text is not None:
        text = prompt.prompt_text
    elif prompt.logprob_pairs:
        text = "\n---\n".join(ctx + cont for ctx, cont in prompt.logprob_pairs)
    else:
        text = plain_prompt_text(prompt.messages)
    return {"prompt": text, "prompt_messages": json.dumps(list(prompt.messages), ensure_ascii=False)}


def rows(arms: dict[str, list[dict]], plan: dict[tuple[str, int], tuple[str, object]], model: str,
         texts: bool = True) -> tuple[list[dict], dict[str, int]]:
    """The table's rows from each arm's records (`arms`: kv name -> records) and the plan ((sample_id, repeat) ->
    (prompt hash, Prompt)), and the counts of rows without a prompt by reason."""
    out, missing = [], {}
    for arm, records in arms.items():
        for rec in records:
            row = {**{k: v for k, v in rec.items() if k not in _NESTED}, "model": model, "arm": arm,
                   "fingerprint": rec.get("arm")}  # the record's `arm` is its fingerprint; here the kv name
            for k in _NESTED:
                row[k] = json.dumps(rec.get(k), ensure_ascii=False, sort_keys=True, default=str)
            row["groups"] = list(rec.get("groups") or [])
            planned = plan.get((rec.get("sample_id"), rec.get("repeat")))
            if planned is None or planned[1] is None:
                reason = "not in this run's plan" if planned is None else "skipped before a prompt was built"
            elif planned[0] != rec.get("prompt_hash"):
                reason = "the plan's prompt differs from the record's (prompt hash)"
            else:
                reason = None
            row.update(prompt_columns(planned[1]) if reason is None else {"prompt": None, "prompt_messages": None})
            row["prompt_source"] = "plan" if reason is None else None
            if reason:
                missing[reason] = missing.get(reason, 0) + 1
            if not texts:
                for k in TEXT_COLUMNS:
                    row.pop(k, None)
            out.append(row)
    return out, missing


def write(path: Path, table_rows: list[dict]) -> None:
    """Write the rows as parquet (pandas + pyarrow); ImportError when pyarrow is missing."""
    import pandas as pd
    import pyarrow  # noqa: F401  (a clear ImportError before pandas picks an engine)

    frame = pd.DataFrame(table_rows)  # the records as stored (already redacted) and the task's own prompts
    tmp = path.with_suffix(".parquet.tmp")
    frame.to_parquet(tmp, index=False)
    tmp.replace(path)
