"""Every public function and method of the documented packages has a docstring.

Public: a module-level function, or a method (properties included) of a module-level class, whose name
does not start with `_`. Exempt: a method that implements an Engine protocol method (in a class named
*Engine) or a Task method (in a subclass of a *Task class); the protocol's own definitions, in
fp8eval/engines/base.py and fp8eval/tasks/base.py, are documented there and are not exempt.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("engines", "tasks", "scoring", "report", "metrics", "perf", "divergence", "sensitivity", "records")
ENGINE_PROTOCOL = frozenset({"describe", "max_model_len", "count_prompt_tokens", "generate", "close",
                             "prefill_stats", "startup_warnings", "token_count_key", "loglikelihood"})
TASK_PROTOCOL = frozenset({"samples", "prompt", "score", "quick_score", "fingerprint", "summarize", "notes"})
PROTOCOL_CLASSES = {("fp8eval/engines/base.py", "Engine"), ("fp8eval/tasks/base.py", "Task")}

_FUNCTION = (ast.FunctionDef, ast.AsyncFunctionDef)


def _base_names(cls: ast.ClassDef) -> list[str]:
    return [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in cls.bases]


def _exempt(rel: str, cls: ast.ClassDef, method: str) -> bool:
    if (rel, cls.name) in PROTOCOL_CLASSES:
        return False
    if method in ENGINE_PROTOCOL and cls.name.endswith("Engine"):
        return True
    return method in TASK_PROTOCOL and any(b.endswith("Task") for b in _base_names(cls))


def public_functions() -> list[tuple[str, int, str, bool]]:
    """(file, line, name, has a docstring) of every public function and method that must have one."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((REPO / "fp8eval" / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
            for node in tree.body:
                if isinstance(node, _FUNCTION) and not node.name.startswith("_"):
                    out.append((rel, node.lineno, node.name, ast.get_docstring(node) is not None))
                elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    for m in node.body:
                        if isinstance(m, _FUNCTION) and not m.name.startswith("_") and not _exempt(rel, node, m.name):
                            out.append((rel, m.lineno, f"{node.name}.{m.name}", ast.get_docstring(m) is not None))
    return out


def test_public_functions_have_docstrings():
    found = public_functions()
    assert len(found) > 100, "the scan found almost nothing: were the packages moved?"
    missing = [f"{rel}:{line} {name}" for rel, line, name, documented in found if not documented]
    assert not missing, f"{len(missing)} public function(s) without a docstring:\n" + "\n".join(missing)


def test_protocol_definitions_are_documented_and_checked():
    names = {(rel, name) for rel, _, name, _ in public_functions()}
    for method in ("describe", "max_model_len", "count_prompt_tokens", "generate", "close"):
        assert ("fp8eval/engines/base.py", f"Engine.{method}") in names
    for method in TASK_PROTOCOL:
        assert ("fp8eval/tasks/base.py", f"Task.{method}") in names
