"""Shared loading for the reasoning tasks: local jsonl / json / csv / parquet files, or the Hugging Face
hub through `datasets` (imported lazily; an offline machine gets an error that says what to pass)."""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import MISSING

from fp8eval.config import TaskConfig
from fp8eval.core.errors import Fp8evalError
from fp8eval.core.hub import prepare_offline
from fp8eval.core.paths import DATA_ROOT
from fp8eval.tasks.base import TASK_DATA_ROOT, Prompt, file_sha256
from fp8eval.validate import InputError, read_jsonl_rows


@dataclass
class HubTaskConfig(TaskConfig):
    """A task whose rows come from a hub dataset split (`datasets.load_dataset`) unless `data_files` is set."""

    dataset: str = MISSING
    dataset_config: Optional[str] = None
    split: str = "test"
    revision: Optional[str] = None


class DataUnavailable(Fp8evalError):
    pass


def resolve(path: str) -> Path:
    """A data file path as given, else relative to the project root, or to the installed package's data
    (so the defaults in conf/task/*.yaml work from any working directory)."""
    p = Path(path).expanduser()
    if p.exists() or p.is_absolute():
        return p
    return DATA_ROOT / p


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of one data file (.jsonl, .jsonl.gz, .json, .csv or .parquet) as dicts; ValueError for any other
    type."""
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if suffix in (".jsonl", ".jsonl.gz"):
        import gzip

        opener = gzip.open if suffix.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            return read_jsonl_rows(f, path)
    if suffix == ".json":
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, list) else data["rows"]
    if suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    if suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict(orient="records")
    raise ValueError(f"{path}: unsupported data file type {suffix!r} (use .jsonl, .json, .csv or .parquet)")


def load_local(data_files: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of every file in `data_files`, in order (paths as resolve() reads them; FileNotFoundError when one is
    missing)."""
    rows: list[dict[str, Any]] = []
    for name in data_files:
        path = resolve(name)
        if not path.exists():
            raise FileNotFoundError(f"task.data_files: {name} not found (looked at {path})")
        rows.extend(read_rows(path))
    return rows


def load_hub(task: str, dataset: str, config: str | None, split: str, revision: str | None) -> list[dict]:
    """A dataset split's rows from the Hugging Face hub; DataUnavailable, with the advice to pass local files, when
    `datasets` is missing or the load fails."""
    hint = (
        f"Pass local files instead, e.g. `task.data_files=[path/to/{task}.jsonl]` "
        "(jsonl, json, csv or parquet with the dataset's columns)."
    )
    offline = prepare_offline()  # before the import: `datasets` reads the offline variables then
    try:
        import datasets
    except ImportError as exc:
        raise DataUnavailable(
            f"task {task}: loading {dataset} from the Hugging Face hub needs the `datasets` package "
            f"(pip install 'fp8eval[tasks]'). {hint}"
        ) from exc
    try:
        ds = datasets.load_dataset(dataset, config, split=split, revision=revision)
    except Exception as exc:  # noqa: BLE001 - offline, gated, or renamed: all need the same advice
        raise DataUnavailable(
            f"task {task}: could not load {dataset}" + (f" ({config})" if config else "")
            + f" split {split} from the Hugging Face hub: {type(exc).__name__}: {exc}. "
            + (f"The hub is not reachable here ({offline}). " if offline else "")
            + "Offline or gated datasets need a local copy. " + hint
        ) from exc
    return [dict(row) for row in ds]


def hub_file(task: str, repo: str, filename: str, revision: str | None) -> Path:
    """One file of a hub dataset repository (for datasets whose loading script `datasets` no longer runs)."""
    hint = f"Pass local files instead: `task.data_files=[path/to/{task}.jsonl]`."
    offline = prepare_offline()
    if offline:
        hint = f"The hub is not reachable here ({offline}). " + hint
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:
        raise DataUnavailable(f"task {task}: downloading {repo} needs huggingface_hub. {hint}") from exc
    try:
        return Path(hf_hub_download(repo, filename, repo_type="dataset", revision=revision))
    except Exception as exc:  # noqa: BLE001
        raise DataUnavailable(
            f"task {task}: could not download {filename} from the hub dataset {repo}: "
            f"{type(exc).__name__}: {exc}. {hint}"
        ) from exc


def first(row: dict, *keys: str, default: Any = None) -> Any:
    """The value of the first of `keys` that the row has, neither None nor '', else `default`."""
    for k in keys:
        if k in row and row[k] is not None and row[k] != "":
            return row[k]
    return default


def render(template: str, **fields: str) -> str:
    """Fill {name} placeholders in one pass: braces inside the inserted values (LaTeX) are left alone,
    and braces in the template that are not a known field stay as they are."""
    return re.sub(r"\{(\w+)\}", lambda m: str(fields[m.group(1)]) if m.group(1) in fields else m.group(0), template)


def task_dir(name: str) -> Path:
    """The task's data folder (templates, local data) under TASK_DATA_ROOT."""
    return TASK_DATA_ROOT / name


# Tasks that pose the same one-message prompt (reason step by step, answer in \boxed{}) share one file.
SHARED_PROMPTS: dict[str, Path] = {name: TASK_DATA_ROOT / "prompts" / "boxed_answer.txt"
                                   for name in ("aime", "aime24", "aime25", "math500")}


def template_path(task: str, filename: str = "prompt.txt") -> Path:
    """Where a task's template lives: its own folder, or the shared prompt it poses."""
    if filename == "prompt.txt" and task in SHARED_PROMPTS:
        return SHARED_PROMPTS[task]
    return task_dir(task) / filename


def read_template(task: str, filename: str = "prompt.txt") -> str:
    """The text of a task's prompt template (see template_path)."""
    with open(template_path(task, filename), encoding="utf-8") as f:
        return f.read()


def templates_hash(task: str) -> dict[str, str]:
    """sha256 of every prompt template file of the task, by the name the task knows it by (part of the
    fingerprint: a shared prompt hashes exactly as the task's own prompt.txt did)."""
    files = {p.name: p for p in sorted(task_dir(task).glob("*.txt"))}
    if task in SHARED_PROMPTS:
        files["prompt.txt"] = SHARED_PROMPTS[task]
    return {name: file_sha256(path) for name, path in sorted(files.items())}


def data_files_hash(data_files: Sequence[str] | None) -> dict[str, str] | None:
    """{name: sha256} of the local data files, or None when there are none (part of the fingerprint)."""
    if not data_files:
        return None
    return {name: file_sha256(resolve(name)) for name in data_files}


def task_rows(task) -> list[dict[str, Any]]:
    """The task's rows: its local `data_files` when given, else its hub dataset."""
    cfg = task.cfg
    if cfg.data_files:
        return load_local(cfg.data_files)
    return load_hub(task.name, cfg.dataset, cfg.dataset_config, cfg.split, cfg.revision)


def finish_samples(name: str, samples: list) -> list:
    """Sample ids key the records: a duplicate would merge two problems' results (the runner applies
    `task.limit` afterwards, `Task.limit_samples`)."""
    if len({s.id for s in samples}) != len(samples):
        raise InputError(f"{name}: duplicate sample ids in the data")
    return samples


def user_prompt(task: str, **fields: str):
    """A one-message chat prompt from the task's `prompt.txt`."""

    return Prompt(messages=({"role": "user", "content": render(read_template(task), **fields)},))
