"""Fail fast on a misspelt override, listing the valid keys (Hydra itself lists only the valid group
options, and for keys says only that one is missing)."""

from __future__ import annotations

import dataclasses
import sys
import typing

from fp8eval.config import EngineConfig, KVConfig, ModelConfig, RunConfig
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


def unknown_key_message(key: str, task_name: str) -> str | None:
    parts = key.split(".")
    head = parts[0]
    if head == "hydra":
        return None
    if head == "task":
        try:
            schema = task_class(task_name).config_class
        except KeyError:
            return None  # Hydra reports the unknown task option itself
    else:
        schema = _GROUP_SCHEMAS.get(head)
    if schema is None:
        top = _fields(RunConfig)
        if len(parts) == 1 or head not in top:
            if head in top:
                return None
            return f"unknown key {key!r}; valid top-level keys: {', '.join(sorted(top))}"
        schema = _unwrap(top[head])
    path = [head]
    for part in parts[1:]:
        if not dataclasses.is_dataclass(schema):
            return None  # a free dict (engine_args, chat_template_kwargs): anything goes
        fields = _fields(schema)
        if part not in fields:
            where = ".".join(path)
            return (f"unknown key {key!r}: {where} has no {part!r}. Valid keys under {where}"
                    f"{f' (task {task_name})' if head == 'task' else ''}: {', '.join(sorted(fields))}")
        schema = _unwrap(fields[part])
        path.append(part)
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


def check_overrides(argv: list[str]) -> None:
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
    task_name = choices.get("task", "niah").split(",")[0]
    top = _fields(RunConfig)
    for ov in overrides:
        key, eq, _ = ov.lstrip("+~").partition("=")
        if "." not in key and "/" not in key and ov.startswith("+") and key not in top and key != "hydra":
            # `+foo=1` adds a key nothing reads: Hydra accepts it, so a typo would pass silently.
            print(f"fp8eval: unknown key {key!r}; valid top-level keys: {', '.join(sorted(top))}", file=sys.stderr)
            sys.exit(2)
        if "." not in key or "/" in key:
            continue
        msg = unknown_key_message(key, task_name)
        if msg:
            print(f"fp8eval: {msg}", file=sys.stderr)
            sys.exit(2)
