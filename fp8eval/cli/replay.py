"""`fp8eval replay RUN_DIR [records_dir=DIR] [hydra.run.dir=DIR]`: the saved run again, from exactly the config it
ran with (RUN_DIR/.hydra/config.yaml), not from today's conf/ with its overrides; or one line saying why not.

The saved config becomes the primary config of a one-off config directory, on the app's own schema (as
conf/<app>.yaml starts from it), with the app's Hydra settings (run dir pattern, callbacks); then the app runs as
`python -m <module>` does. Records are the original run's (a relative records_dir is read from the directory the
run started in), so a replay of a finished run sends no request and prints the same result; `records_dir=NEW`
generates every completion again. Keys that decide a result cannot be changed here: that is a new run.
"""

from __future__ import annotations

import runpy
import sys
import tempfile
from pathlib import Path

# What a replay may change: where things are written and how they are shown, nothing a result depends on.
CHANGEABLE = ("records_dir", "progress", "report", "scoring_workers", "records_commit_s")
PREFIX = "replay_"  # the primary config is replay_<app config>; the app's own config stays reachable by name
MASK = "***"  # what fp8eval.core.secrets writes over a secret in saved files


class ReplayError(Exception):
    pass


def _load(path: Path):
    """A saved YAML file; ReplayError (one line) when a secret was masked in it or it does not parse."""
    from omegaconf import OmegaConf

    if path.is_file() and MASK in path.read_text(encoding="utf-8", errors="replace"):
        raise ReplayError(f"{path} has secrets masked as {MASK} (fp8eval never writes them): rerun the original "
                          f"command with them instead")
    try:
        return OmegaConf.load(path)
    except Exception as e:  # noqa: BLE001 - yaml's and OmegaConf's errors alike: a file replay cannot read
        raise ReplayError(f"{path} does not parse ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from e


def _app(run: Path):
    """(the Command that made the run, the .hydra/hydra.yaml that says so): the run's own, else its parent's (a
    suite's task subdirectory)."""
    from fp8eval.cli.commands import COMMANDS

    for d in (run, run.parent):
        meta = d / ".hydra" / "hydra.yaml"
        if meta.is_file():
            name = str(_load(meta).hydra.job.get("config_name")).removeprefix(PREFIX)  # a replay's replay too
            for cmd in COMMANDS.values():
                if cmd.config and cmd.config == name:
                    return cmd, meta
            raise ReplayError(f"{meta} names config {name!r}, which no fp8eval subcommand composes")
    raise ReplayError(f"{run / '.hydra' / 'hydra.yaml'} not found: not the run directory of an fp8eval Hydra app")


def replay_config(run: Path, changes: list[str]):
    """(the app's Command, the primary config to compose, extra overrides) for a replay of `run`."""
    from omegaconf import OmegaConf

    from fp8eval.core.paths import CONF_DIR

    saved_path = run / ".hydra" / "config.yaml"
    if not saved_path.is_file():
        raise ReplayError(f"{saved_path} not found: RUN_DIR is the directory a run printed last")
    saved = _load(saved_path)
    cmd, meta = _app(run)
    if OmegaConf.select(saved, "suite") is not None:
        raise ReplayError(f"{run} is a suite run: replay each task's subdirectory ({run}/<task>)")
    for change in changes:
        key = change.lstrip("+").partition("=")[0]
        if not (key in CHANGEABLE or key.startswith("hydra.")) or "=" not in change:
            raise ReplayError(f"{change!r}: a replay changes only {', '.join(CHANGEABLE)} and hydra.*; for other "
                              f"changes run `fp8eval` with the run's overrides ({run}/.hydra/overrides.yaml) and yours")
    project = _load(CONF_DIR / f"{cmd.config}.yaml")
    defaults = [d for d in project.defaults if isinstance(d, str) and d.endswith("_schema")][:1]
    task = OmegaConf.select(saved, "task.name")
    if task is not None:
        defaults.append({"/schema/task@task": str(task)})  # the task's own keys (lengths, depths, ...)
    defaults.append("_self_")
    defaults += [{k: v} for d in project.defaults if not isinstance(d, str) for k, v in d.items()
                 if str(k).startswith("override hydra/")]
    primary = OmegaConf.create({"defaults": defaults})
    primary = OmegaConf.merge(primary, saved, {"hydra": project.get("hydra", {})})
    extra = list(changes)
    records = OmegaConf.select(saved, "records_dir")
    cwd = OmegaConf.select(_load(meta), "hydra.runtime.cwd")
    if (records is not None and not any(c.startswith("records_dir=") for c in changes) and cwd
            and not Path(str(records)).is_absolute()):
        extra.append(f"records_dir={Path(str(cwd)) / str(records)}")  # the records the run wrote, from anywhere
    return cmd, primary, extra


def main(argv: list[str]) -> int:
    """`fp8eval replay RUN_DIR [changes]`; 2 with one line when the run cannot be replayed."""
    from omegaconf import OmegaConf

    from fp8eval.core.paths import CONF_DIR

    if not argv or argv[0].startswith("-"):
        print("usage: fp8eval replay RUN_DIR [records_dir=DIR] [hydra.run.dir=DIR]\n\n" + __doc__.split("\n\n")[0],
              file=sys.stderr if not argv else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    run = Path(argv[0])
    try:
        cmd, primary, extra = replay_config(run, argv[1:])
    except (ReplayError, OSError, ValueError) as e:
        print(f"fp8eval replay: {e}", file=sys.stderr)
        return 2
    print(f"replay of {run} ({cmd.name}, from its saved config)", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="fp8eval-replay-") as tmp:
        OmegaConf.save(primary, Path(tmp) / f"{PREFIX}{cmd.config}.yaml")
        # conf/ stays on the search path: the run composes its baseline's kv option by name, as it did
        sys.argv = [cmd.module, "--config-path", tmp, "--config-name", PREFIX + cmd.config,
                    "--config-dir", str(CONF_DIR), *extra]
        runpy.run_module(cmd.module, run_name="__main__", alter_sys=True)
    return 0
