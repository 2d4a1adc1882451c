"""Math answer scoring: the last \\boxed{} of the answer text, AIME integers, MATH-500 via math-verify.

The runner has already removed the thinking text; these functions see the final answer only. They are
pure (same input, same Score) apart from math-verify's per-item timeout, which turns a pathological
expression into a recorded failure ("timeout" in details) rather than a hang.
"""

from __future__ import annotations

import functools
import re
import threading

from fp8eval.tasks.base import Score

DEFAULT_TIMEOUT_S = 5.0
_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """Content of the brace group opening at text[start] == '{' (nested braces allowed)."""
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            continue
        if ch == "{" and (i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif ch == "}" and (i == 0 or text[i - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return text[start + 1:i], i + 1
    return None  # unbalanced: the completion was cut off inside the box


def boxed_answers(text: str) -> list[str]:
    """Every \\boxed{...} / \\fbox{...} / `\\boxed 5` in order of appearance."""
    found = []
    pattern = re.compile("|".join(re.escape(c) for c in _BOX_COMMANDS) + r"(?![A-Za-z])")
    for m in pattern.finditer(text):
        i = m.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            got = _braced(text, i)
            if got is not None:
                found.append(got[0].strip())
        elif i > m.end():  # "\boxed 5": the token up to whitespace or a closing $
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                found.append(token.group(0).rstrip(".,;"))
    return found


def last_boxed(text: str) -> str | None:
    found = boxed_answers(text or "")
    return found[-1] if found else None


# ---------------------------------------------------------------------------------- math-verify
def _run_with_timeout(fn, timeout_s: float):
    """math-verify's own timeout uses signal.alarm (main thread only); run in a daemon thread instead.
    A timed-out computation is abandoned (it cannot be killed) and scored as a failure."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - a parser crash is a non-match, recorded
            box["error"] = repr(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        return None, "timeout"
    return box.get("value"), box.get("error")


def _mv():
    try:
        import math_verify
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("math scoring needs math-verify: pip install 'math-verify[antlr4_9_3]'") from exc
    return math_verify


@functools.lru_cache(maxsize=4096)
def parse_gold(gold: str, timeout_s: float = DEFAULT_TIMEOUT_S):
    """The gold answer parsed once per process (golds repeat across repeats and arms)."""
    mv = _mv()
    text = gold if "\\boxed" in gold else "\\boxed{" + gold + "}"
    value, err = _run_with_timeout(lambda: mv.parse(text, parsing_timeout=None), timeout_s)
    return value or []


def math_verify_equal(gold: str, predicted: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[bool, str | None]:
    """(equal, error). The gold is parsed first and passed first: verify() is not symmetric."""
    mv = _mv()
    gold_parsed = parse_gold(gold, timeout_s)
    if not gold_parsed:
        return False, "gold unparsable"
    pred_text = "\\boxed{" + predicted + "}"
    pred, err = _run_with_timeout(lambda: mv.parse(pred_text, parsing_timeout=None), timeout_s)
    if err or not pred:
        return False, err or "prediction unparsable"
    ok, err = _run_with_timeout(lambda: mv.verify(gold_parsed, pred, timeout_seconds=None), timeout_s)
    return bool(ok), err


def _normalise(s: str) -> str:
    s = s.strip().strip("$").strip()
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("\\,", "")
    s = s.replace("dfrac", "frac").replace("tfrac", "frac").replace("\\%", "").replace("%", "")
    return re.sub(r"\s+", "", s).rstrip(".")


# ---------------------------------------------------------------------------------- scorers
_INT = re.compile(r"^[+]?0*(\d{1,3})$")


def aime_integer(extracted: str) -> int | None:
    """The answer as an AIME integer (0-999), tolerating $, \\text{}, ^\\circ, commas; else None."""
    s = _normalise(extracted).replace(",", "")
    s = re.sub(r"\^\{?\\circ\}?$", "", s)
    m = _INT.match(s)
    return int(m.group(1)) if m else None


def score_aime(answer_text: str, gold: int | str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Score:
    extracted = last_boxed(answer_text)
    gold_int = int(str(gold).strip())
    if extracted is None:
        return Score(0.0, None, {"method": "no_boxed"})
    value = aime_integer(extracted)
    if value is not None:
        return Score(float(value == gold_int), extracted, {"method": "integer", "value": value})
    ok, err = math_verify_equal(str(gold_int), extracted, timeout_s)
    details = {"method": "math_verify"}
    if err:
        details["error"] = err
    return Score(float(ok), extracted, details)


def score_math(answer_text: str, gold: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Score:
    """MATH-500: last box, then a cheap normalised string match, then math-verify equivalence."""
    extracted = last_boxed(answer_text)
    if extracted is None:
        return Score(0.0, None, {"method": "no_boxed"})
    if _normalise(extracted) == _normalise(gold):
        return Score(1.0, extracted, {"method": "exact"})
    ok, err = math_verify_equal(gold, extracted, timeout_s)
    details = {"method": "math_verify"}
    if err:
        details["error"] = err
    return Score(float(ok), extracted, details)
