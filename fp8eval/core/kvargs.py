"""`key=value` arguments for the argparse tools (report, records, probe, knobaudit), in the style of the Hydra apps:
`stats.gate=95` means `--gate 95`, as `fp8eval stats.gate=95` does; their `--flags` keep working."""

from __future__ import annotations

import argparse


def key_value_flags(argv: list[str], parser: argparse.ArgumentParser, aliases: dict[str, str] | None = None,
                    prefixes: tuple[str, ...] = ()) -> list[str]:
    """`argv` with every `key=value` whose key names one of `parser`'s options turned into that option:
    `n_boot=500` -> `--n-boot 500`, an alias (`stats.gate` -> `--gate`), a key under one of `prefixes`
    (`report.gate`); a store_true option takes `true`/`false`. Anything else (paths, engine overrides) is kept."""
    options = {}
    for action in parser._actions:  # noqa: SLF001 - argparse keeps its options here, it has no public view
        for flag in action.option_strings:
            if flag.startswith("--"):
                options[flag[2:]] = action
    out: list[str] = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or arg.startswith("-"):
            out.append(arg)
            continue
        flag = (aliases or {}).get(key)
        if flag is None:
            bare = next((key[len(p) + 1 :] for p in prefixes if key.startswith(p + ".")), key)
            name = bare.replace("_", "-")
            flag = f"--{name}" if name in options else None
        action = options.get(flag[2:]) if flag else None
        if action is None:
            out.append(arg)
            continue
        if isinstance(action, argparse._StoreTrueAction):  # noqa: SLF001
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                parser.error(f"{key} takes true or false, not {value!r}")
            if value.lower() in ("true", "1", "yes"):
                out.append(flag)
            continue
        out.extend([flag, value])
    return out
