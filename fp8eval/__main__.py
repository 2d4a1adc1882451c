"""`python -m fp8eval`: evaluate a kv arm against its baseline and print the recovery table.

The last line printed on stdout is the run directory (other tools read it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra import compose
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from fp8eval.bounds import RUN_RULES, check_names, check_numbers
from fp8eval.calibrate.config import CalibrationError
from fp8eval.core.errors import Fp8evalError
from fp8eval.core.jsonio import write_json
from fp8eval.core.paths import display_path
from fp8eval.core.secrets import redact_files, redact_obj
from fp8eval.overrides import check_overrides, free_dict_overrides
from fp8eval.registry import register_configs
from fp8eval.report import write_report
from fp8eval.runner import Runner
from fp8eval.table import format_table
from fp8eval.wing import hydra_wing

register_configs()


def run(typed, run_dir: Path) -> None:
    """Run the composed task (or suite) for the kv arm and its baseline; print the run dir last. A config that
    cannot be made (`${calibrated:...}` with nothing calibrated yet) or an fp8eval error exits 2 with one line."""
    # every numeric option and every name that becomes a path, before any work (and before the plan)
    check_numbers(typed, RUN_RULES)
    check_names(typed)
    if typed.dry_run or typed.plan.gpus is not None:  # presets state their cost before they start
        from fp8eval.plan import format_plan
        from fp8eval.runner import effective_sampling

        print(format_plan(typed, effective_sampling(typed)))
        if typed.dry_run:
            print("dry run: no model loaded, no request sent")
            return
    summaries = _run_suite(typed, run_dir) if typed.suite is not None else {"": _run_one(typed, run_dir)}
    _refuse_unscored(summaries, run_dir)
    if typed.report and typed.shard is None:  # a shard's summary is partial; the unsharded rerun reports
        _write_report(run_dir)
    print(display_path(run_dir))


def _run_one(typed, run_dir: Path) -> dict:
    summary = Runner(typed, run_dir).run()
    print()
    print(format_table(summary))
    return summary


def _refuse_unscored(summaries: dict[str, dict], run_dir: Path) -> None:
    """An arm without one scored sample has no score to compare: one line and a non-zero exit (after every
    task of a suite ran and every summary.json is written)."""
    unscored = [f"{f'{task} ' if task else ''}kv={n} ({a.get('n_errors')} errors, {a.get('n_skipped')} skipped of "
                f"{a.get('n_records')} records)"
                for task, s in summaries.items() for n, a in s["arms"].items() if not a.get("n_scored")]
    if unscored:
        raise Fp8evalError(f"no scored sample in {'; '.join(unscored)}: there is no score to compare "
                           f"(summary.json written in {display_path(run_dir)}; errors are retried by a rerun)")


def _run_suite(typed, run_dir: Path) -> dict[str, dict]:
    """Each task of the suite composed as `task=<name>` with the user's other overrides, in its own
    subdirectory with its own saved config, so the report reads each like a single run."""
    user = [o for o in HydraConfig.get().overrides.task
            if o.split("=")[0].lstrip("+~").split(".")[0] != "suite" and o.split("=")[0].lstrip("+~") != "task"]
    summaries = {}
    for name in typed.suite.tasks:
        composed = compose(config_name="config", overrides=[*user, f"task={name}"])
        sub = run_dir / name
        (sub / ".hydra").mkdir(parents=True, exist_ok=True)
        OmegaConf.save(composed, sub / ".hydra" / "config.yaml")
        redact_files(sub / ".hydra")
        summaries[name] = _run_one(OmegaConf.to_object(composed), sub)
    suite = {"model": typed.model.name, "task": f"suite:{typed.suite.name}", "suite": list(typed.suite.tasks),
             "tasks": {n: str(run_dir / n / "summary.json") for n in summaries},
             "recovery": {n: (s.get("recovery") or {}).get("overall") for n, s in summaries.items()},
             "verdict": {n: ((s.get("verdict") or {}).get("overall") or {}).get("verdict") for n, s in summaries.items()}}
    write_json(run_dir / "suite.json", redact_obj(suite))
    return summaries


def _label_dummy(run_dir: Path, report: Path) -> None:
    """A dummy-weight run's report says at its top that every score is meaningless (report.md, index.html)."""
    notes = {json.loads(p.read_text()).get("accuracy_note") for p in run_dir.rglob("summary.json")} - {None}
    if not notes:
        return
    note = sorted(notes)[0]
    report = report if report.is_dir() else report.parent
    md, html = report / "report.md", report / "index.html"
    if md.is_file() and note not in md.read_text():
        md.write_text(f"> **{note}**\n\n" + md.read_text())
    if html.is_file() and note not in html.read_text():
        text = html.read_text()
        at = text.find(">", text.find("<body")) + 1 if "<body" in text else 0
        html.write_text(text[:at] + f'<p style="color:#b00;font-weight:bold">{note}</p>' + text[at:])


def _write_report(run_dir: Path) -> None:
    if not any(run_dir.rglob("summary.json")):
        return
    try:
        out = write_report([run_dir], run_dir / "report")
        _label_dummy(run_dir, Path(out))
        print(f"report: {display_path(out)}")
    except Exception as e:  # the run's results stand even when a figure fails
        print(f"report: not written ({type(e).__name__}: {e})", file=sys.stderr)


def _argv(argv: list[str]) -> list[str]:
    check_overrides(argv)
    return free_dict_overrides(argv)


# One line, not a traceback, on Ctrl-C or SIGTERM: every finished record is on disk, the rest is resent on the rerun.
main = hydra_wing("fp8eval", "config", run, errors=(Fp8evalError, CalibrationError), argv=_argv,
                  interrupted="interrupted; finished records are kept, rerun the same command to resume")


if __name__ == "__main__":
    main()
