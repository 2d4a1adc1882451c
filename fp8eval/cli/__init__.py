"""`fp8eval`: one command over every tool of the project.

    fp8eval [run] [group=option ...] [key=value ...]     the paired run (what `python -m fp8eval` does)
    fp8eval report RUN_DIR... [stats.gate=95]            any other tool: `fp8eval SUBCOMMAND ...`
    fp8eval replay RUN_DIR                               a saved run again, exactly
    fp8eval --help [KEY]  /  fp8eval SUBCOMMAND --help   the keys, explained
    fp8eval --version

A subcommand runs its tool as `python -m <module>` does (the tool's own entry, unchanged): this module only
chooses which one, and answers `--help` and `--version` without importing the tools.
"""

from __future__ import annotations

import runpy
import sys

from fp8eval.cli.commands import COMMANDS

HELP_FLAGS = ("--help", "-h")


def version_line() -> str:
    """`fp8eval <version> (commit <c>)`: the checkout's commit from git, else the one recorded at build time."""
    from fp8eval import __version__
    from fp8eval.cli.version import commit

    return f"fp8eval {__version__} (commit {commit()})"


def help_text(name: str, argv: list[str]) -> str | None:
    """The help `fp8eval NAME ... --help [KEY]` prints (None: the tool prints its own argparse help)."""
    from fp8eval.cli.help import command_help, top_help

    at = next(i for i, a in enumerate(argv) if a in HELP_FLAGS)
    topic = argv[at + 1] if at + 1 < len(argv) and not argv[at + 1].startswith("-") else None
    if name == "" and topic is None:
        return top_help()
    return command_help(COMMANDS[name or "run"], topic)


def main(argv: list[str] | None = None) -> int:
    """The `fp8eval` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["--version"], ["-V"]):
        print(version_line())
        return 0
    name = argv[0] if argv and argv[0] in COMMANDS else ""
    rest = argv[1:] if name else argv
    if not name and argv and "=" not in argv[0] and not argv[0].startswith("-"):
        from fp8eval.cli.help import suggestion

        print(f"fp8eval: unknown subcommand {argv[0]!r}{suggestion(argv[0], list(COMMANDS))} "
              f"(subcommands: {', '.join(COMMANDS)}; key=value arguments go to `run`)", file=sys.stderr)
        return 2
    if any(a in HELP_FLAGS for a in rest):
        text = help_text(name, rest)
        if text is not None:
            print(text)
            return 0
    cmd = COMMANDS[name or "run"]
    if cmd.config and cmd.name != "run":  # `run` checks its overrides itself (fp8eval.overrides)
        from fp8eval.cli.help import key_problem

        problem = key_problem(cmd, rest)
        if problem:
            print(f"fp8eval {cmd.name}: {problem}", file=sys.stderr)
            return 2
    if cmd.name == "replay":
        from fp8eval.cli.replay import main as replay

        return replay(rest)
    sys.argv = [cmd.module, *rest]
    runpy.run_module(cmd.module, run_name="__main__", alter_sys=True)
    return 0
