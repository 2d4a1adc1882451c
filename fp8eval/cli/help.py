"""`fp8eval --help`, `fp8eval SUBCOMMAND --help [KEY]`: the subcommands, each Hydra app's groups with their options
and its keys explained (their comments in the config dataclasses), without importing torch, transformers or Hydra."""

from __future__ import annotations

import textwrap

from fp8eval.cli.commands import COMMANDS, Command
from fp8eval.cli.keys import Schema, app_groups, group_options, lookup, schema, schema_of, task_schema
from fp8eval.core.paths import CONF_DIR

WIDTH = 110
HYDRA_FLAGS = """Hydra flags: -m/--multirun (a sweep: kv=bf16,fp8,fp8_e5m2; `run` ends it with one combined report), --cfg job (print the
composed config), --config-dir DIR (add your own configs: conf groups and options under DIR), hydra.run.dir=DIR,
hydra.searchpath=[file://DIR] (same as --config-dir), --info. Replay a saved run: fp8eval replay RUN_DIR."""


def _wrap(text: str, indent: int) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=" " * indent, subsequent_indent=" " * indent) or [""]


def _short(text: str) -> str:
    """The first sentence of a docstring or comment."""
    first = " ".join(text.split())
    return first[: first.index(". ") + 1] if ". " in first else first


def describe_keys(sch: Schema, prefix: str = "") -> list[str]:
    """One entry per key: `name (type, default X)`, then its explanation; a nested config says where its keys are."""
    lines = []
    for k in sch.keys:
        nested = schema_of(k.module or sch.module, k.type)
        head = f"  {prefix}{k.name}"
        if nested is not None:
            doc = k.doc or _short(nested.doc)
            lines.append(f"{head}.*  ({nested.name}; `--help {prefix}{k.name}` lists its keys)")
        else:
            default = "" if k.default == "required" else f", default {k.default}"
            lines.append(f"{head}  ({k.type}{default}{', required' if k.default == 'required' else ''})")
            doc = k.doc
        if doc:
            lines.extend(_wrap(doc, 6))
    return lines


def top_help() -> str:
    """`fp8eval --help`."""
    lines = ["usage: fp8eval [SUBCOMMAND] [group=option ...] [key=value ...] [-m]", "",
             "FP8 vs BF16 KV cache: paired recovery with confidence intervals. Without a subcommand, `run`.",
             "Every subcommand takes key=value (`fp8eval report RUN stats.gate=90`); `fp8eval SUBCOMMAND --help`",
             "explains its keys, `fp8eval --help KEY` one group of keys (`--help model`, `--help task=mrcr`).", "",
             "subcommands:"]
    lines += [f"  {c.name:<12} {c.summary}" for c in COMMANDS.values()]
    lines += ["", *hydra_app_help(COMMANDS["run"], header=False)]
    lines += ["", "fp8eval --version prints the version and commit. `python -m fp8eval ...` is the same as `fp8eval run ...`."]
    return "\n".join(lines)


def hydra_app_help(cmd: Command, header: bool = True) -> list[str]:
    """Groups (with their options and default) and the top-level keys of one Hydra app."""
    lines = [f"usage: fp8eval {cmd.name} [group=option ...] [key=value ...] [-m]", "", cmd.summary, ""] if header else []
    lines.append(f"groups of `{cmd.name}` (group=option; the default in brackets):")
    for group, default in app_groups(CONF_DIR, cmd.config):
        options = group_options(CONF_DIR, group)
        shown = ", ".join(f"[{o}]" if o == default else o for o in options)
        text = f"{group:<11} {shown}{'' if default else '  (none by default)'}"
        lines.extend(textwrap.wrap(text, WIDTH, initial_indent="  ", subsequent_indent=" " * 14))
    if any(g == "model" for g, _ in app_groups(CONF_DIR, cmd.config)):
        lines.append("  your own model: model=hf model.hf_id=ORG/NAME (or a local directory); context length and")
        lines.append("    sampling come from its config.json and generation_config.json")
    sch = schema(*cmd.schema)
    lines += ["", f"keys of `{cmd.name}` (key=value):", *describe_keys(sch), "",
              *textwrap.wrap(" ".join(HYDRA_FLAGS.split()), WIDTH)]
    return lines


def topic_help(cmd: Command, topic: str) -> str:
    """`--help model`, `--help task=mrcr`, `--help stats`, `--help model.sampling`: the keys under one name."""
    name, _, option = topic.partition("=")
    root = schema(*cmd.schema)
    if name == "task":
        task = option or _default_option(cmd, "task") or "niah"
        sch = task_schema(task)
        if sch is None:
            return f"fp8eval: no task {task!r}; tasks: {', '.join(group_options(CONF_DIR, 'task'))}"
        title = f"task.* of task={task}"
    else:
        key, sch = lookup(root, name)
        if key is None:
            return f"fp8eval: {cmd.name} has no key {name!r}{suggestion(name, [k.name for k in root.keys])}"
        if sch is None:
            return "\n".join([f"{name} ({key.type}, default {key.default})", *(_wrap(key.doc, 2) if key.doc else [])])
        title = f"{name}.* ({sch.name})"
    lines = [title, *_wrap(sch.doc, 2)] if sch.doc else [title]
    lines += describe_keys(sch, prefix=f"{name}.")
    group = name.split(".")[0]
    if "." not in name and group_options(CONF_DIR, group):
        lines += ["", f"options (`{group}=NAME`, files in conf/{group}/): {', '.join(group_options(CONF_DIR, group))}"]
    return "\n".join(lines)


def _default_option(cmd: Command, group: str) -> str | None:
    return dict(app_groups(CONF_DIR, cmd.config)).get(group)


def suggestion(word: str, choices: list[str]) -> str:
    """" (did you mean X?)" for the closest choice, else ""."""
    import difflib

    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def command_help(cmd: Command, topic: str | None) -> str | None:
    """The help of a Hydra subcommand (None for an argparse tool: it prints its own)."""
    if cmd.config is None:
        return None
    return topic_help(cmd, topic) if topic else "\n".join(hydra_app_help(cmd))


HYDRA_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--info", "-i", "--experimental-rerun"}


def key_problem(cmd: Command, argv: list[str]) -> str | None:
    """A misspelt key of a Hydra subcommand, with the closest valid one: the top level, and one level under the
    subcommand's own settings (`perf.lenghts`); model/kv/engine/task keys are left to the subcommand's own checks."""
    root = schema(*cmd.schema)
    groups = {g for g, _ in app_groups(CONF_DIR, cmd.config)}
    top = {k.name for k in root.keys} | groups | {"hydra"}
    skip = False
    for arg in argv:
        if skip or arg.startswith("-"):
            skip = not skip and arg in HYDRA_VALUE_FLAGS
            continue
        key, eq, _ = arg.lstrip("+~").partition("=")
        if not eq or "/" in key:
            continue
        head, _, rest = key.partition(".")
        if head not in top:
            return (f"unknown key {key!r}{suggestion(head, sorted(top))}; valid top-level keys of "
                    f"`fp8eval {cmd.name}`: {', '.join(sorted(top - {'hydra'}))}")
        if rest and head not in ("model", "kv", "engine", "task", "hydra"):
            _, sub = lookup(root, head)
            name = rest.split(".")[0]
            if sub is not None and all(k.name != name for k in sub.keys):
                valid = [k.name for k in sub.keys]
                return (f"unknown key {key!r}: {head} has no {name!r}{suggestion(name, valid)}; valid keys under "
                        f"{head}: {', '.join(sorted(valid))}")
    return None
