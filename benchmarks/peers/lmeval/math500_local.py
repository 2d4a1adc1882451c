"""Hooks for math500_local.yaml: lm-eval's own minerva_math utilities, with process_results applied to
every repeat (mean over repeats) instead of only the first."""

from lm_eval.tasks.minerva_math.utils import (  # noqa: F401  (re-exported for the YAML's !function)
    doc_to_text,
    list_fewshot_samples,
    process_docs,
)
from lm_eval.tasks.minerva_math.utils import process_results as _minerva_process_results


def process_results(doc: dict, results: list) -> dict:
    completions = results[0] if results and isinstance(results[0], list) else results
    scores = [_minerva_process_results(doc, [c]) for c in completions]
    return {key: sum(s[key] for s in scores) / len(scores) for key in scores[0]}
