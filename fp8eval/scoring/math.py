"""Math answer scoring: the last \\boxed{} of the answer text, AIME integers, MATH-500 via math-verify.

The runner has already removed the thinking text; these functions see the final answer only. They are
pure (same input, same Score) apart from math-verify's per-item timeout, which turns a pathological
expression into a recorded failure ("timeout" in details) rather than a hang.
"""

from __future__ import annotations

import functools
import re
import signal
import threading

from fp8eval.core.types import Score

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
    """The content of the answer's last \\boxed{} (the final answer), or None when there is none."""
    found = boxed_answers(text or "")
    return found[-1] if found else None


# ---------------------------------------------------------------------------------- math-verify
class _Deadline(BaseException):
    """Not an Exception: math-verify and sympy catch those broadly and would swallow the timeout."""


def _raise_deadline(signum, frame):
    raise _Deadline()


def _run_with_timeout(fn, timeout_s: float):
    """(value, error) of fn() within timeout_s seconds; a timed-out or crashing computation is scored as a
    failure. On the main thread (the CLI, the scoring pool's workers) a SIGALRM interval timer interrupts
    the computation itself: starting a thread per call cost ~3 ms under load, more than most
    math-verify calls. Elsewhere a daemon thread is waited on and abandoned on timeout (it cannot be
    killed). math-verify's own timeout is signal.alarm, whole seconds, main thread only; ours replaces it."""
    if threading.current_thread() is threading.main_thread() and timeout_s and timeout_s > 0:
        old = signal.signal(signal.SIGALRM, _raise_deadline)
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            try:
                value = fn()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Deadline:  # also when the timer fired just as fn returned: it took the whole budget
            return None, "timeout"
        except Exception as exc:  # noqa: BLE001 - a parser crash is a non-match, recorded
            return None, repr(exc)
        finally:
            signal.signal(signal.SIGALRM, old)
        return value, None
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


@functools.lru_cache(maxsize=65536)
def math_verify_equal(gold: str, predicted: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[bool, str | None]:
    """(equal, error). The gold is parsed first and passed first: verify() is not symmetric. Cached: the
    same answer to the same problem recurs across repeats and across the two arms of a pair."""
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
_PLAIN_INT = re.compile(r"^[+-]?\d+$")


def aime_integer(extracted: str) -> int | None:
    """The answer as an AIME integer (0-999), tolerating $, \\text{}, ^\\circ, commas; else None."""
    s = _normalise(extracted).replace(",", "")
    s = re.sub(r"\^\{?\\circ\}?$", "", s)
    m = _INT.match(s)
    return int(m.group(1)) if m else None


def score_aime(answer_text: str, gold: int | str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Score:
    """An AIME answer's score: its last \\boxed{} read as an integer and compared with `gold`, else math-verify
    equality; 0 without a \\boxed{}."""
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


def quick_math(answer_text: str, gold: str) -> Score | None:
    """The cheap checks of score_math (last box, normalised string match, two plain integers); None when
    only math-verify can decide."""
    extracted = last_boxed(answer_text)
    if extracted is None:
        return Score(0.0, None, {"method": "no_boxed"})
    pred_n, gold_n = _normalise(extracted), _normalise(gold)
    if pred_n == gold_n:
        return Score(1.0, extracted, {"method": "exact"})
    if _PLAIN_INT.match(pred_n) and _PLAIN_INT.match(gold_n):
        # Two plain integers: equal exactly when their values are (what math-verify says, ~1000x cheaper).
        return Score(float(int(pred_n) == int(gold_n)), extracted, {"method": "integer"})
    return None


def score_math(answer_text: str, gold: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Score:
    """MATH-500: last box, then cheap exact checks, then math-verify equivalence."""
    quick = quick_math(answer_text, gold)
    if quick is not None:
        return quick
    extracted = last_boxed(answer_text)
    ok, err = math_verify_equal(gold, extracted, timeout_s)
    details = {"method": "math_verify"}
    if err:
        details["error"] = err
    return Score(float(ok), extracted, details)
