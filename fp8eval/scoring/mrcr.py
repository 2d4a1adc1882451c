"""The official openai/mrcr grading rule (dataset card), nothing added.

Deliberately no normalisation (no whitespace strip, no case folding) and difflib's default arguments
(autojunk on), because those are what the published MRCR numbers use; vLLM's own smoke test turns
autojunk off, which gives different ratios on long answers.
"""

from __future__ import annotations

from difflib import SequenceMatcher


def mrcr_grade(response: str, answer: str, random_string_to_prepend: str) -> float:
    """0.0 unless `response` starts with the hash; else the SequenceMatcher ratio of both texts with
    the hash removed from the front of each."""
    if not response.startswith(random_string_to_prepend):
        return 0.0
    response = response.removeprefix(random_string_to_prepend)
    answer = answer.removeprefix(random_string_to_prepend)
    return float(SequenceMatcher(None, response, answer).ratio())
