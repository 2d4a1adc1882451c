"""Finding run directories and loading their arms.

Identity (model, task, kv, baseline) comes from each run's saved `.hydra/config.yaml`, `summary.json`
and the records themselves, never from folder names. An arm shared by several runs (the BF16 baseline
of an fp8 run and of an fp8-skip-layers run) is loaded once, keyed by its fingerprint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from fp8eval.records.reader import read_arm


class ReportInputError(RuntimeError):
    """An input cannot be read as a run directory; the message says which file and why."""


@dataclass(slots=True)
class Record:
    data: dict
    line: int  # 1-based line in the records file, for flip-list references


@dataclass
class Arm:
    model: str
    task: str
    kv: str
    fingerprint: str
    records_path: Path
    records: list[Record]
    summary: dict  # this arm's entry of summary.json (auc, auc_1m, ... task extras)
    run_dirs: list[Path] = field(default_factory=list)
    label: str = ""  # display name; the kv name unless two arms share it
    n_duplicates: int = 0  # lines that do not count (fp8eval.records.reader: duplicates, foreign, corrupt)

    @property
    def task_versions(self) -> set[str]:
        """The task versions its records were made with (more than one means mixed records)."""
        return {str(r.data.get("task_version")) for r in self.records}


@dataclass
class Run:
    run_dir: Path
    model: str
    task: str
    baseline: str | None
    variant_kv: str
    seed: Any
    config: dict
    summary: dict
    arms: dict[str, Arm]  # kv name -> arm


def find_run_dirs(paths: list[Path]) -> list[Path]:
    """Each PATH is a run directory (holds summary.json) or an output root searched recursively."""
    found: list[Path] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise ReportInputError(f"{p}: no such file or directory")
        if p.is_file() and p.name == "summary.json":
            found.append(p.parent.resolve())
        elif (p / "summary.json").is_file():
            found.append(p.resolve())
        elif p.is_dir():
            found.extend(s.parent.resolve() for s in sorted(p.rglob("summary.json")))
    unique = list(dict.fromkeys(found))
    if not unique:
        raise ReportInputError(
            "no run directory found under " + ", ".join(str(p) for p in paths)
            + " (a run directory holds summary.json and .hydra/config.yaml)")
    return unique


def _load_config(run_dir: Path) -> dict:
    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        raise ReportInputError(f"{run_dir}: missing .hydra/config.yaml (the run's identity is read from it)")
    conf = OmegaConf.load(path)
    try:
        return OmegaConf.to_container(conf, resolve=True)  # type: ignore[return-value]
    except Exception:  # an interpolation that only resolves inside the app (e.g. hydra:runtime)
        return OmegaConf.to_container(conf, resolve=False)  # type: ignore[return-value]


def _resolve_records_path(raw: str, run_dir: Path, config: dict) -> Path:
    """Records paths are written absolute or relative to the directory the run started in, which
    Hydra does not save; try the run dir and each of its ancestors (the project root is one)."""
    p = Path(raw)
    if p.is_absolute():
        if p.is_file():
            return p
        candidates = [p]
    else:
        bases = [run_dir, *run_dir.parents, Path.cwd()]
        candidates = [b / p for b in bases]
        for c in candidates:
            if c.is_file():
                return c.resolve()
    raise ReportInputError(
        f"{run_dir}: records file {raw!r} named in summary.json not found (looked at the run directory,"
        f" its parents and the current directory; records_dir in the config is"
        f" {config.get('records_dir')!r})")


def _name(section: Any, what: str, run_dir: Path) -> str:
    if isinstance(section, dict) and section.get("name"):
        return str(section["name"])
    raise ReportInputError(f"{run_dir}: .hydra/config.yaml has no {what}.name")


def load_run(run_dir: Path, arm_cache: dict[str, Arm]) -> Run:
    """One run directory read into a Run (config, summary, arms); an arm already in `arm_cache` (same fingerprint) is
    shared. ReportInputError when they disagree."""
    config = _load_config(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ReportInputError(f"{run_dir}/summary.json: not JSON ({e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ReportInputError(f"{run_dir}/summary.json: cannot be read ({e})") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("arms"), dict):
        raise ReportInputError(f"{run_dir}/summary.json: not a run summary (a JSON {type(summary).__name__}"
                               f"{'' if not isinstance(summary, dict) else ' without an arms object'})")
    model = _name(config.get("model"), "model", run_dir)
    task = _name(config.get("task"), "task", run_dir)
    variant_kv = _name(config.get("kv"), "kv", run_dir)
    baseline = summary.get("baseline", config.get("baseline"))
    if baseline in (None, "none", "null", ""):
        baseline = None
    for key, mine in (("model", model), ("task", task)):
        theirs = summary.get(key)
        if theirs is not None and str(theirs) != mine:
            raise ReportInputError(
                f"{run_dir}: summary.json says {key}={theirs!r} but .hydra/config.yaml says {mine!r}")
    arms: dict[str, Arm] = {}
    for kv, arm_summary in (summary.get("arms") or {}).items():
        if not isinstance(arm_summary, dict) or not arm_summary.get("records"):
            raise ReportInputError(f"{run_dir}/summary.json: arm {kv!r} names no records file")
        path = _resolve_records_path(str(arm_summary["records"]), run_dir, config)
        fp = str(arm_summary.get("fingerprint") or path.stem)
        if fp in arm_cache:
            arm = arm_cache[fp]
            if (arm.model, arm.task, arm.kv) != (model, task, kv):
                raise ReportInputError(
                    f"{run_dir}: arm fingerprint {fp[:12]} is ({model}, {task}, {kv}) here but"
                    f" ({arm.model}, {arm.task}, {arm.kv}) in {arm.run_dirs[0]}")
            arm.run_dirs.append(run_dir)
        else:
            arm = _load_arm(model, task, kv, fp, path, arm_summary, run_dir)
            arm_cache[fp] = arm
        arms[kv] = arm
    if not arms:
        raise ReportInputError(f"{run_dir}/summary.json: no arms")
    if baseline is not None and baseline not in arms:
        raise ReportInputError(
            f"{run_dir}: baseline {baseline!r} is not among the arms ({', '.join(arms)})")
    return Run(run_dir, model, task, baseline, variant_kv, config.get("seed"), config, summary, arms)


def _load_arm(model: str, task: str, kv: str, fp: str, path: Path, arm_summary: dict,
              run_dir: Path) -> Arm:
    """The arm's records as the runner counts them (fp8eval.records.read_arm: one per (sample, repeat),
    the last done one; foreign, corrupt and duplicate lines set aside and counted in `n_duplicates`)."""
    # The report never shows completion texts nor per-record sampling: leaving them out keeps a large arm small;
    # where flips of this task were dissected, arms keep their completions (with the baseline's they key the
    # anatomy rows, fp8eval.records.anatomy).
    from fp8eval.records.anatomy import store_path

    dissected = store_path(Path(path).parents[1], task, fp).parent.is_dir()
    # Nor the fields it never reads (what made the record and when: arm, schema, seed, time, latency_s).
    drop = ("reasoning", "score_details", "sampling", "skip_reason", "arm", "schema", "seed", "time", "latency_s") + (
        () if dissected else ("completion",))
    view = read_arm(path, fp if len(fp) == 64 else None, task, drop=drop)
    records = [Record(rec, where[1]) for rec, where in zip(view.records, view.where)]
    return Arm(model, task, kv, fp, path, records, arm_summary, [run_dir], kv, sum(view.ignored.values()))


def load_runs(paths: list[Path]) -> tuple[list[Run], list[Arm]]:
    """Every run under `paths` and every distinct arm among them, arms labelled apart where two share a kv name."""
    arm_cache: dict[str, Arm] = {}
    runs = [load_run(d, arm_cache) for d in find_run_dirs(paths)]
    arms = list(arm_cache.values())
    _assign_labels(arms)
    return runs, arms


def _assign_labels(arms: list[Arm]) -> None:
    """Two arms of one (model, task) with the same kv name but different fingerprints (another engine,
    another scales file) get the fingerprint prefix in their label so tables never merge them."""
    by_key: dict[tuple[str, str, str], list[Arm]] = {}
    for a in arms:
        by_key.setdefault((a.model, a.task, a.kv), []).append(a)
    for group in by_key.values():
        for a in group:
            a.label = a.kv if len(group) == 1 else f"{a.kv}@{a.fingerprint[:8]}"
