"""The rooms' arrows point one way: no import cycle among fp8eval's modules, counting imports inside
functions; core imports nothing above it; no module over 500 lines."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "fp8eval"
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the fp8eval modules it imports anywhere (top level or inside a function)."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                    pkg = pkg[: len(pkg) - node.level + 1]
                    base = ".".join(pkg + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = resolve(name) if name.startswith("fp8eval") else None
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    assert _cycles(import_graph()) == []


def test_core_imports_nothing_above_it():
    graph = import_graph()
    for mod, deps in graph.items():
        if mod.startswith("fp8eval.core"):
            above = sorted(d for d in deps if not d.startswith("fp8eval.core") and d != "fp8eval")
            assert not above, f"{mod} imports {above}"


def test_lower_rooms_never_import_the_runner_report_or_clis():
    top = ("fp8eval.runner", "fp8eval.report", "fp8eval.__main__", "fp8eval.registry")
    low = ("fp8eval.core", "fp8eval.config", "fp8eval.metrics", "fp8eval.tasks", "fp8eval.scoring",
           "fp8eval.engines")
    graph = import_graph()
    for mod, deps in graph.items():
        if mod.startswith(low):
            bad = sorted(d for d in deps if d.startswith(top))
            assert not bad, f"{mod} imports {bad}"


def test_no_module_over_500_lines():
    long = {str(p.relative_to(REPO)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these by concern: {long}"
