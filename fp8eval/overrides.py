"""Fail fast on a misspelt override, listing the valid keys (Hydra itself lists only the valid group
options, and for keys says only that one is missing)."""

from __future__ import annotations

import dataclasses
import re
import sys
import typing
from pathlib import Path

from fp8eval.bounds import NAME_KEYS, name_problem
from fp8eval.config import EngineConfig, KVConfig, ModelConfig, RunConfig
from fp8eval.core.paths import CONF_DIR
from fp8eval.tasks import task_class

_GROUP_SCHEMAS = {"model": ModelConfig, "kv": KVConfig, "engine": EngineConfig}
# Flags of the Hydra CLI that take a value.
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--info", "-i", "--experimental-rerun"}


def _fields(cls) -> dict[str, typing.Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _unwrap(tp):
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Union and len(args) == 1:
        return args[0]
    return tp


def did_you_mean(word: str, choices) -> str:
    """" (did you mean X?)" for the closest of `choices`, else ""."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _leaf(key: str, task_name: str) -> tuple[str | None, typing.Any]:
    """(problem, type) of a dotted key: an unknown-key message, else None and the key's type (None when it lies in
    a free dict or where nothing is known)."""
    parts = key.split(".")
    head = parts[0]
    if head == "hydra":
        return None, None
    if head == "task":
        try:
            schema = task_class(task_name).config_class
        except KeyError:
            return None, None  # Hydra reports the unknown task option itself
    else:
        schema = _GROUP_SCHEMAS.get(head)
    if schema is None:
        top = _fields(RunConfig)
        if len(parts) == 1 or head not in top:
            if head in top:
                return None, _unwrap(top[head])
            return (f"unknown key {key!r}{did_you_mean(head, top)}; valid top-level keys: {', '.join(sorted(top))}",
                    None)
        schema = _unwrap(top[head])
    path = [head]
    tp: typing.Any = schema
    for part in parts[1:]:
        if not dataclasses.is_dataclass(schema):
            return None, None  # a free dict (engine_args, chat_template_kwargs): anything goes
        fields = _fields(schema)
        if part not in fields:
            where = ".".join(path)
            return (f"unknown key {key!r}: {where} has no {part!r}{did_you_mean(part, fields)}. Valid keys under "
                    f"{where}{f' (task {task_name})' if head == 'task' else ''}: {', '.join(sorted(fields))}", None)
        tp = fields[part]
        schema = _unwrap(tp)
        path.append(part)
    return None, tp


def unknown_key_message(key: str, task_name: str) -> str | None:
    return _leaf(key, task_name)[0]


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) if typing.get_origin(tp) is None else str(tp).replace("typing.", "")


def type_message(key: str, value: str, tp) -> str | None:
    """Why `key=value` does not fit the key's type, with an example that does (None when it fits or when the value
    is a sweep, an interpolation or a Hydra function that Hydra will judge)."""
    if tp is None or "${" in value or value.startswith(("glob(", "range(", "choice(", "interval(", "shuffle(")):
        return None
    if "," in value and not value.startswith(("[", "{", "'", '"')):
        return None  # a -m sweep: each value is checked when composed
    optional = type(None) in typing.get_args(tp)
    base = _unwrap(tp)
    want = f"{key} takes {_type_name(base)}{' or null' if optional else ''}"
    if value in ("null", "None", "~"):
        return None if optional or base is typing.Any else f"{want}, not null"
    origin = typing.get_origin(base)
    if dataclasses.is_dataclass(base):
        return f"{key} is a group of keys ({key}.*: {', '.join(sorted(_fields(base)))}); set one of them"
    if origin is list:
        return None if value.startswith("[") else f"{want}, not {value!r}: write a list, e.g. {key}=[{value}]"
    if origin is dict:
        return None if value.startswith("{") else f"{want}, not {value!r}: write a dict, e.g. {key}={{name: {value}}}"
    checks = {int: lambda v: int(v), float: lambda v: float(v),
              bool: lambda v: {"true": 1, "false": 0, "yes": 1, "no": 0, "on": 1, "off": 0}[v.lower()]}
    if base in checks:
        try:
            checks[base](value)
        except (ValueError, KeyError):
            example = {int: "8", float: "0.5", bool: "true"}[base]
            return f"{want}, not {value!r} (e.g. {key}={example})"
    return None


_FREE_DICTS = ("model.engine_args.", "kv.engine_args.", "engine.engine_args.", "engine.default_headers.")


def free_dict_overrides(argv: list[str]) -> list[str]:
    """`kv.engine_args.X=V` -> `++kv.engine_args.X=V`: engine_args hold any vLLM EngineArgs name, so setting
    one must not depend on whether the chosen option already lists it (Hydra's struct mode would ask
    for `+` when it does not, and refuse `+` when it does). Used by `python -m fp8eval`."""
    out = []
    for arg in argv:
        key, eq, _ = arg.partition("=")
        if eq and not arg.startswith(("+", "~", "-")) and key.startswith(_FREE_DICTS) and key.count(".") == 2:
            arg = "++" + arg
        out.append(arg)
    return out


def preset_task(experiment: str | None) -> str | None:
    """The task an `experiment=` preset selects (its `override /task: NAME` default), so that the keys of
    that task are the valid `task.*` keys; None when there is no preset or it selects none."""
    if not experiment:
        return None
    path = CONF_DIR / "experiment" / f"{experiment.split(',')[0]}.yaml"
    try:
        import yaml

        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, ValueError, ImportError):
        return None  # Hydra names an unknown preset itself
    for item in data.get("defaults") or [] if isinstance(data, dict) else []:
        if isinstance(item, dict):
            for k, v in item.items():
                if str(k).replace("override", "").strip().lstrip("/") == "task" and isinstance(v, str):
                    return v
    task = data.get("task") if isinstance(data, dict) else None
    return task.get("name") if isinstance(task, dict) and isinstance(task.get("name"), str) else None


def _flag_value(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg[len(name) + 1 :]
    return None


def option_message(group: str, value: str, argv: list[str]) -> str | None:
    """"no kv option 'fp9' (did you mean fp8?); options: ..." when no conf/<group>/<option>.yaml (nor one under
    --config-dir) exists; None when every option exists, or a search path may hold it."""
    if "${" in value or value.startswith(("glob(", "choice(", "range(")) or any(
            a.startswith(("hydra.searchpath", "+hydra.searchpath")) for a in argv):
        return None
    dirs = [CONF_DIR / group]
    extra = _flag_value(argv, "--config-dir", "-cd")
    if extra:
        dirs.append(Path(extra).expanduser() / group)
    have = sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.yaml")})
    for option in (v.strip() for v in value.strip("[]").split(",")):
        if option and option != "null" and option not in have:
            return f"no {group} option {option!r}{did_you_mean(option, have)}; options: {', '.join(have)}"
    return None


def config_source_message(argv: list[str], schema: str = "run_schema", config: str = "config") -> str | None:
    """Why `--config-path` / `--config-dir` would not compose what the user means: a saved run's .hydra (Hydra would
    compose fp8eval's own conf/config.yaml instead under --config-dir, or an untyped config under --config-path),
    a primary config without fp8eval's schema, or a file that fp8eval's own config of the same name shadows."""
    name = _flag_value(argv, "--config-name", "-cn") or config
    for flag, where in ((("--config-path", "-cp"), "path"), (("--config-dir", "-cd"), "dir")):
        given = _flag_value(argv, *flag)
        if not given:
            continue
        d = Path(given).expanduser()
        mine = d / f"{name}.yaml"
        if (d / "hydra.yaml").is_file() and (d / "config.yaml").is_file():
            return (f"{given} holds a saved run's config: replay that run with `fp8eval replay {d.parent}` "
                    f"(--config-{where} would not compose it as it ran)")
        if where == "path" and mine.is_file() and schema not in mine.read_text(encoding="utf-8"):
            return (f"--config-path {given}: {mine.name} does not start from fp8eval's schema (its defaults must "
                    f"list {schema} first, as fp8eval's conf/{config}.yaml does); to add your own options to "
                    f"fp8eval's configs, use --config-dir {given}")
        if where == "dir" and mine.is_file() and (CONF_DIR / f"{name}.yaml").is_file():
            return (f"--config-dir {given}: its {mine.name} is shadowed by fp8eval's own {name}.yaml (the primary "
                    f"config is searched first); give yours another name and pass --config-name NAME")
    return None


def check_overrides(argv: list[str]) -> None:
    problem = config_source_message(argv)
    if problem:
        print(f"fp8eval: {problem}", file=sys.stderr)
        sys.exit(2)
    overrides = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg.startswith("-"):
            skip = arg in _FLAGS_WITH_VALUE
            continue
        overrides.append(arg)
    choices = {}
    for ov in overrides:
        key, eq, value = ov.lstrip("+~").partition("=")
        if eq and "." not in key and "/" not in key:
            choices[key] = value
    if choices.get("model") == "hf" and not any(o.lstrip("+").startswith("model.hf_id=") for o in overrides):
        print("fp8eval: model=hf needs your model: model.hf_id=ORG/NAME (a hub id) or model.hf_id=/path/to/dir",
              file=sys.stderr)
        sys.exit(2)
    task_name = choices.get("task") or preset_task(choices.get("experiment")) or "niah"
    task_name = task_name.split(",")[0]
    top = _fields(RunConfig)
    groups = set(re.findall(r"^\s*-\s*(\w+)\s*:", (CONF_DIR / "config.yaml").read_text(encoding="utf-8"), re.M))
    for ov in overrides:
        key, eq, value = ov.lstrip("+~").partition("=")
        if eq and key in NAME_KEYS and "," not in value and name_problem(value):
            print(f"fp8eval: {key}={name_problem(value)}", file=sys.stderr)  # it would become a path
            sys.exit(2)
    for ov in overrides:
        key, eq, value = ov.lstrip("+~").partition("=")
        if "." not in key and "/" not in key and key not in top and key not in groups and key != "hydra":
            # `+foo=1` adds a key nothing reads (Hydra accepts it, so a typo would pass silently); `modle=x` gets
            # Hydra's bare "not in struct"
            print(f"fp8eval: unknown key {key!r}{did_you_mean(key, set(top) | groups)}; valid top-level keys: "
                  f"{', '.join(sorted(top))}; groups: {', '.join(sorted(groups - set(top)))}", file=sys.stderr)
            sys.exit(2)
        if "." not in key and key in groups and eq and not ov.startswith("~"):
            msg = option_message(key, value, argv)
            if msg:
                print(f"fp8eval: {msg}", file=sys.stderr)
                sys.exit(2)
        if "/" in key or ("." not in key and key in groups) or ov.startswith("~"):
            continue
        msg, tp = _leaf(key, task_name)
        if msg is None and eq:
            msg = type_message(key, value, tp)
        if msg:
            print(f"fp8eval: {msg}", file=sys.stderr)
            sys.exit(2)
