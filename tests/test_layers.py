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


# The declared floors (docs/ARCHITECTURE.md, "Rooms and arrows"), lowest first: every top-level module or
# package of fp8eval has one, and an import may point only to the same floor or below. A new module must be
# placed here to pass.
RANKS = {
    "core": 0, "__init__": 0,
    "config": 1, "validate": 1, "bounds": 1, "quant": 1, "models": 1, "scales": 1,  # dataclasses, input checks, files
    "feasibility": 1,  # can vLLM serve a skip list (core.kvformats + vLLM in a subprocess)
    "metrics": 2,
    "scoring": 3, "sandbox": 3,
    "tasks": 4,
    "engines": 5,
    "records": 6,
    "report": 7, "export": 7,  # export: lm-eval results, records.parquet, the card, trackers (after summary.json)
    "runner": 8, "arms": 8, "shard": 8, "plan": 8, "token_counts": 8, "overrides": 8, "stopping": 8, "table": 8,
    "control": 8, "anatomy": 8,
    "registry": 9, "wing": 9,  # the shared ConfigStore and resolvers; the one shell of every Hydra wing
    "calibrate": 10, "divergence": 10, "perf": 10, "power": 10, "probe": 10, "knobaudit": 10,  # the wings
    "sensitivity": 11,  # builds on divergence's measures and passages
    "pareto": 11,  # every KV format on one frontier: divergence's probe through the door
    "__main__": 12, "hydra_callbacks": 12, "up": 12,  # up: keeps a run's vLLM servers alive (the warm path)
    "cli": 12,  # the `fp8eval` command: runs the tools by module name (runpy), explains keys from the sources
}
# The one import allowed to run back up: the `${calibrated:<strategy>}` resolver that every Hydra CLI shares
# needs the calibration store to name the latest checkpoint.
UPWARD_ALLOWED = {("fp8eval.registry", "fp8eval.calibrate.store")}


def _floor(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_top_level_module_has_a_floor():
    missing = sorted({_floor(m) for m in _modules()} - set(RANKS))
    assert not missing, f"place these in tests/test_layers.py RANKS (and docs/ARCHITECTURE.md): {missing}"
    stale = sorted(set(RANKS) - {_floor(m) for m in _modules()})
    assert not stale, f"RANKS names modules that no longer exist: {stale}"


def test_every_import_points_down_the_declared_order():
    up = sorted((mod, dep) for mod, deps in import_graph().items() for dep in deps
                if RANKS[_floor(dep)] > RANKS[_floor(mod)] and (mod, dep) not in UPWARD_ALLOWED)
    assert not up, "imports pointing up the floors: " + ", ".join(f"{a} -> {b}" for a, b in up)


def test_no_module_over_500_lines():
    long = {str(p.relative_to(REPO)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these by concern: {long}"
