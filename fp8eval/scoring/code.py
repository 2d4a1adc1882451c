"""Code scoring (LiveCodeBench): the code block as the official extraction finds it, the hub's compressed
private tests, and pass@1 = every test passes in the sandbox (`fp8eval.scoring.sandbox`)."""

from __future__ import annotations

import base64
import json
import pickle
import zlib

from fp8eval.core.types import Score
from fp8eval.scoring.sandbox import run_tests_detailed


def extract_code(text: str) -> str | None:
    """The official LiveCodeBench extraction: the lines between the last two lines that contain ``` anywhere
    (a fence opened after prose on the same line counts; after a closed block, an unclosed last fence pairs
    with that block's closing line). None when fewer than two such lines (officially "", which fails)."""
    lines = (text or "").split("\n")
    fences = [i for i, line in enumerate(lines) if "```" in line]
    if len(fences) < 2:
        return None
    return "\n".join(lines[fences[-2] + 1:fences[-1]])


class _JsonStringOnly(pickle.Unpickler):
    """The hub's private tests are a pickled *string*; refuse every class so a crafted file cannot run code."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")


def decode_tests(field: str | list | None) -> list[dict]:
    """LCB test cases from a dataset field: a JSON list, or (hub `private_test_cases`) a JSON list that was
    pickled, zlib-compressed and base64-encoded. Empty / missing gives []."""
    if field is None or field == "":
        return []
    if isinstance(field, list):
        return field
    try:
        return json.loads(field)
    except ValueError:
        pass
    raw = _JsonStringOnly(__import__("io").BytesIO(zlib.decompress(base64.b64decode(field)))).load()
    return json.loads(raw) if isinstance(raw, (str, bytes)) else raw


def score_code(answer_text: str, tests: list[dict], testtype: str, func_name: str | None = None,
               timeout_s: float = 6.0) -> Score:
    """pass@1 for one completion. Tests after the first failing wave are not run (pass@1 is already 0)."""

    code = extract_code(answer_text)
    if code is None:
        return Score(0.0, None, {"status": "no_code_block", "n_tests": len(tests)})
    verdicts = run_tests_detailed(code, tests, testtype, func_name, timeout_s, stop_on_failure=True)
    statuses: dict[str, int] = {}
    for v in verdicts:
        statuses[v.status] = statuses.get(v.status, 0) + 1
    passed = bool(verdicts) and all(v.passed for v in verdicts)
    first_fail = next((v for v in verdicts if not v.passed), None)
    details = {"n_tests": len(tests), "statuses": statuses}
    if first_fail is not None:
        details["first_failure"] = {"status": first_fail.status, "exit_code": first_fail.exit_code,
                                    "stderr_tail": first_fail.stderr_tail[-500:]}
    return Score(float(passed), code, details)
