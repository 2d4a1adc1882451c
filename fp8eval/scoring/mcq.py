"""Multiple-choice scoring (GPQA): a deterministic choice order and a tolerant letter extractor."""

from __future__ import annotations

import re

from fp8eval.core.seeds import permutation
from fp8eval.core.types import Score

LETTERS = "ABCD"

# Each pattern captures one letter; across all patterns the match that ENDS last in the text wins, so a
# model that reconsiders ("Answer: B ... wait ... Answer: C") is scored on its final word.
_L = r"([A-D])(?![A-Za-z0-9])"
_PATTERNS = [
    # \boxed{C}, \boxed{\text{C}}, \boxed{(C)}, \boxed{\textbf{C}}
    re.compile(r"\\boxed\s*\{\s*(?:\\text(?:bf)?\s*\{)?\s*\(?\s*" + _L + r"\s*\)?\s*\}?\s*\}"),
    # Answer: C / **Answer:** (C) / ANSWER: **C** / Final answer - [C] / The answer is C / answer is: (C)
    re.compile(
        r"(?i:answer)\s*(?i:is)?\s*(?:\*\*|__)?\s*[:：\-]?\s*(?:\*\*|__)?\s*(?i:option|choice)?\s*"
        r"[\(\[\*]*\s*" + _L
    ),
    # "The correct option is (C)", "the best choice is C"
    re.compile(r"(?i:correct|best|right)\s+(?i:option|choice)\s+(?i:is)\s*:?\s*[\(\[\*]*\s*" + _L),
]


def choice_order(record_id: str, repeat: int, seed: int) -> list[int]:
    """Which original option (0 = the correct one, 1-3 the incorrect ones) is shown at A, B, C, D.
    A pure function of (record id, repeat, seed), so both arms see the same order."""
    return permutation(4, record_id, repeat, seed)


def correct_letter(order: list[int]) -> str:
    """The letter the correct option (original index 0) is shown at under `order`."""
    return LETTERS[order.index(0)]


def extract_letter(text: str) -> str | None:
    """The answer's chosen letter: the match of the answer patterns that ends last, else an answer that is only a letter
    ('C', '(C).', '**C**'), else None."""
    best: tuple[int, str] | None = None
    for pattern in _PATTERNS:
        for m in pattern.finditer(text or ""):
            if best is None or m.end() > best[0]:
                best = (m.end(), m.group(1))
    if best is not None:
        return best[1]
    # Last resort: the whole answer is just a letter, e.g. "C" or "(C)." or "**C**".
    bare = re.fullmatch(r"[\s\*\(\[]*" + _L + r"[\s\*\)\]\.]*", text or "")
    return bare.group(1) if bare else None


def score_mcq(answer_text: str, gold_letter: str) -> Score:
    """1.0 when the extracted letter is `gold_letter`, else 0.0 (extracted letter and gold in the Score)."""
    letter = extract_letter(answer_text)
    return Score(float(letter == gold_letter), letter, {"gold": gold_letter})
