"""Every config key's type, default and explanation, read from the dataclasses' source (fp8eval/config.py and each
wing's config.py) with `ast`, and every group's options from conf/: nothing is imported, so `--help` is fast.

A key's explanation is its comment: the comment lines right above the field and the comment at the end of its line.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

PKG = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Key:
    """One field of a config dataclass."""

    name: str
    type: str  # the annotation as written
    default: str  # the default as written ("required" when it has none or MISSING)
    doc: str  # its comments, joined
    module: str = ""  # the module that defines it (where its type's name is looked up)


@dataclass(frozen=True)
class Schema:
    """A config dataclass: its docstring, its fields (bases first) and where it is defined."""

    name: str
    doc: str
    keys: tuple[Key, ...]
    module: str


def _module_file(module: str) -> Path | None:
    rel = Path(*module.split(".")[1:])
    for p in (PKG / rel.with_suffix(".py"), PKG / rel / "__init__.py"):
        if p.is_file():
            return p
    return None


@lru_cache(maxsize=None)
def _parsed(module: str) -> tuple[ast.Module, list[str]] | None:
    path = _module_file(module)
    if path is None:
        return None
    text = path.read_text(encoding="utf-8")
    return ast.parse(text), text.splitlines()


def _imports(tree: ast.Module, module: str) -> dict[str, str]:
    """name -> module it is imported from (`from fp8eval.x import Y`), relative imports resolved."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: -node.level]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                out[alias.asname or alias.name] = base
    return out


def _comments_above(lines: list[str], lineno: int) -> list[str]:
    out = []
    i = lineno - 2  # the line above the field (0-based)
    while i >= 0 and lines[i].strip().startswith("#"):
        out.insert(0, lines[i].strip().lstrip("#").strip())
        i -= 1
    return out


def _inline_comment(line: str) -> str:
    """The `# ...` at the end of a source line (outside strings, roughly: the last ' # ')."""
    at = line.find("  # ")
    return line[at + 4 :].strip() if at >= 0 else ""


def _default(node: ast.AnnAssign) -> str:
    v = node.value
    if v is None:
        return "required"
    if isinstance(v, ast.Call) and getattr(v.func, "id", "") == "field":
        for kw in v.keywords:
            if kw.arg == "default_factory":
                f = ast.unparse(kw.value.body if isinstance(kw.value, ast.Lambda) else kw.value)
                if isinstance(kw.value, ast.Lambda):
                    return f
                return {"dict": "{}", "list": "[]"}.get(f, f"{f}()")
            if kw.arg == "default":
                return ast.unparse(kw.value)
        return "required"
    text = ast.unparse(v)
    return "required" if text == "MISSING" else text


def find_class(module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
    """(defining module, class node) of `name` defined in, or imported into, `module` (followed up to 4 hops)."""
    parsed = _parsed(module)
    if parsed is None or depth > 4:
        return None
    tree, _ = parsed
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
    source = _imports(tree, module).get(name)
    return find_class(source, name, depth + 1) if source and source.startswith("fp8eval") else None


@lru_cache(maxsize=None)
def schema(module: str, name: str) -> Schema | None:
    """The dataclass `name` defined in (or imported into) `module`, fields of its bases first."""
    found = find_class(module, name)
    if found is None:
        return None
    module, node = found
    lines = _parsed(module)[1]
    keys: dict[str, Key] = {}
    for base in node.bases:
        b = schema_of(module, ast.unparse(base))
        for k in b.keys if b else ():
            keys[k.name] = k
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            if ast.unparse(item.annotation).startswith("ClassVar"):
                continue
            doc = " ".join(_comments_above(lines, item.lineno) + [_inline_comment(lines[item.lineno - 1])])
            keys[item.target.id] = Key(item.target.id, ast.unparse(item.annotation), _default(item), doc.strip(),
                                       module)
    return Schema(name, ast.get_docstring(node) or "", tuple(keys.values()), module)


def task_schema(task: str) -> Schema | None:
    """The config dataclass of a registered task (its Task class's `config_class`), from the source."""
    from fp8eval.tasks import REGISTRY  # the registry module imports no task

    if task not in REGISTRY:
        return None
    module, _, cls = REGISTRY[task].partition(":")
    found = find_class(module, cls)
    while found is not None:
        mod, node = found
        for item in node.body:
            if isinstance(item, ast.Assign) and any(getattr(t, "id", "") == "config_class" for t in item.targets):
                return schema(mod, ast.unparse(item.value))
        bases = [ast.unparse(b) for b in node.bases]
        found = find_class(mod, bases[0]) if bases else None
    return None


def schema_of(module: str, annotation: str) -> Schema | None:
    """The dataclass an annotation names (`ModelConfig`, `Optional[SuiteConfig]`), seen from `module`."""
    for word in annotation.replace("[", " ").replace("]", " ").replace(",", " ").replace("|", " ").split():
        if word[:1].isupper() and word not in ("Optional", "Any", "None", "Union"):
            found = schema(module, word)
            if found is not None:
                return found
    return None


def lookup(root: Schema, dotted: str) -> tuple[Key | None, Schema | None]:
    """The key at `a.b.c` under `root` and the schema it holds (None when it is not a dataclass)."""
    current: Schema | None = root
    key = None
    for part in dotted.split("."):
        if current is None:
            return None, None
        key = next((k for k in current.keys if k.name == part), None)
        if key is None:
            return None, None
        current = schema_of(key.module or current.module, key.type)
    return key, current


def group_options(conf_dir: Path, group: str) -> list[str]:
    """The options of a config group (conf/<group>/*.yaml), sorted."""
    d = conf_dir / group
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def app_groups(conf_dir: Path, config_name: str) -> list[tuple[str, str | None]]:
    """(group, default option) of an app's primary config's defaults list, in order; schema/ and hydra/ left out."""
    out = []
    path = conf_dir / f"{config_name}.yaml"
    for raw in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        line = raw.split("#")[0].strip()
        if not line.startswith("- ") or ":" not in line:
            continue
        group, _, option = line[2:].partition(":")
        group, option = group.strip(), option.strip()
        if group.startswith(("override", "/schema", "schema", "hydra")) or " " in group:
            continue
        out.append((group.lstrip("/").split("@")[0], None if option in ("null", "") else option))
    return out
