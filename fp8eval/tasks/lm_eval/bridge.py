"""lm-eval's side of the bridge: its TaskManager loads the tasks (YAML, prompts, few-shot, filters) and
builds each document's requests; nothing here runs a model.

Offline: a task whose data is local (`dataset_path: json` with `dataset_kwargs.data_files`) needs no hub.
When the hub is off (task.offline=true, HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set, or not reachable within
a few seconds) the datasets library is put in offline mode first, so a hub dataset that is not already in
its cache fails at once, with advice, instead of after half a minute of retries.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8eval.core.errors import Fp8evalError
from fp8eval.core.filehash import file_sha256

SUPPORTED_OUTPUT_TYPES = ("generate_until", "multiple_choice", "loglikelihood")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_MANAGERS: dict[str, Any] = {}


class LmEvalError(Fp8evalError):
    """An lm-eval task cannot be loaded or run through fp8eval; the message says why and what to do."""


@dataclass
class Loaded:
    """What lm-eval built: its tasks by name, each task's groups (ancestors first) and its documents'
    requests, doc_id -> [Instance] in lm-eval's own order (idx)."""

    version: str
    tasks: dict[str, Any]
    groups: dict[str, list[str]]
    instances: dict[str, dict[int, list[Any]]] = field(default_factory=dict)


def hub_offline(setting: bool | None) -> bool:
    """True when the hub must not be asked: the setting, else the HF environment, else a 3 s probe."""
    if setting is not None:
        return bool(setting)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return True
    host = re.sub(r"^https?://", "", os.environ.get("HF_ENDPOINT", "huggingface.co")).split("/")[0]
    try:
        socket.create_connection((host.split(":")[0], 443), timeout=3).close()
        return False
    except OSError:
        return True


def _go_offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    # Both libraries read these at import time; they may already be imported in this process.
    import datasets.config
    import huggingface_hub.constants

    datasets.config.HF_HUB_OFFLINE = True
    huggingface_hub.constants.HF_HUB_OFFLINE = True


def _resolve_paths(spec: Any) -> Any:
    """A dict spec's relative data_files are taken from the current directory, as lm-eval would, but made
    absolute so the loaded task does not depend on where a later step runs."""
    if not isinstance(spec, dict):
        return spec
    spec = json.loads(json.dumps(spec))
    files = (spec.get("dataset_kwargs") or {}).get("data_files")
    if isinstance(files, str):
        spec["dataset_kwargs"]["data_files"] = str(Path(files).resolve())
    elif isinstance(files, list):
        spec["dataset_kwargs"]["data_files"] = [str(Path(f).resolve()) for f in files]
    elif isinstance(files, dict):
        spec["dataset_kwargs"]["data_files"] = {k: (str(Path(v).resolve()) if isinstance(v, str)
                                                    else [str(Path(x).resolve()) for x in v])
                                                for k, v in files.items()}
    return spec


def load(specs: list[Any], include_path: str | None, metadata: dict, offline: bool | None) -> Loaded:
    """lm-eval's TaskManager.load on the specs (names, groups, tags, YAML paths or {task: ..., overrides})."""
    if not specs:
        raise LmEvalError("task=lm_eval needs task.tasks, e.g. task.tasks=[gsm8k] (names, groups, tags, YAML "
                          "paths, or {task: NAME, ...overrides})")
    if include_path and not Path(include_path).exists():
        raise LmEvalError(f"task.include_path={include_path!r} does not exist")
    off = hub_offline(offline)
    if off:
        _go_offline()
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise LmEvalError(f"task=lm_eval needs lm-eval ({e}); install it with pip install 'fp8eval[lm_eval]'") from e
    # simple_evaluate's global seeds (its defaults), for tasks whose document processing draws from them.
    import random

    import numpy as np
    from lm_eval.defaults import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED

    random.seed(DEFAULT_RANDOM_SEED)
    np.random.seed(DEFAULT_OTHER_SEED)
    key = json.dumps([include_path, metadata], sort_keys=True, default=str)
    if key not in _MANAGERS:  # its index scan reads every YAML lm-eval ships (seconds): once per process
        _MANAGERS[key] = TaskManager(include_path=include_path, metadata=dict(metadata) or None)
    tm = _MANAGERS[key]
    specs = [_resolve_paths(s) for s in specs]
    for spec in specs:
        name = spec if isinstance(spec, str) else None
        if name and name not in tm.all_tasks and not Path(name).is_file():
            close = [t for t in tm.all_tasks if name.lower() in t.lower()][:10]
            raise LmEvalError(f"lm-eval has no task, group or tag {name!r}"
                              + (f"; similar: {', '.join(close)}" if close else "")
                              + (f" (include_path={include_path})" if include_path else ""))
    try:
        loaded = tm.load([_with_overrides(tm, s) for s in specs])
    except ConnectionError as e:
        where = "the hub is offline here" if off else "the hub could not be reached"
        raise LmEvalError(
            f"lm-eval could not load its dataset: {str(e).splitlines()[0]}; {where}. Download the dataset once "
            f"where the hub is reachable (it is then read from the datasets cache), or point the task at local "
            f"data: in a YAML under task.include_path, or as a task.tasks entry {{task: NAME, dataset_path: json, "
            f"dataset_kwargs: {{data_files: {{test: FILE.jsonl}}}}}} (see docs/lm_eval.md).") from e
    parents: dict[str, list[str]] = {}
    for group, children in (loaded.get("group_map") or {}).items():
        for child in children:
            parents.setdefault(child, []).append(group)

    def ancestors(name: str) -> list[str]:
        out: list[str] = []
        for g in parents.get(name, []):
            for a in ancestors(g) + [g]:
                if a not in out:
                    out.append(a)
        return out

    tasks = dict(loaded["tasks"])
    for name, task in tasks.items():
        out_type = task.OUTPUT_TYPE
        if out_type not in SUPPORTED_OUTPUT_TYPES:
            raise LmEvalError(
                f"lm-eval task {name!r} has output_type {out_type!r}; fp8eval runs {', '.join(SUPPORTED_OUTPUT_TYPES)} "
                f"(a perplexity has no pass rate to recover)")
        if int(task.config.repeats or 1) != 1:
            raise LmEvalError(f"lm-eval task {name!r} asks for repeats={task.config.repeats}; set the task's "
                              f"repeats to 1 and use task.repeats, which fp8eval pairs and seeds per repeat")
    return Loaded(version=lm_eval.__version__, tasks=tasks, groups={n: ancestors(n) for n in tasks})


def _with_overrides(tm, spec: Any) -> Any:
    """{task: NAME, ...} naming a registered task or group: that task with these keys over its YAML. lm-eval
    0.4.13's TaskManager.load takes such a dict as a whole inline config, so its factory (what load uses for
    a name) is called with the keys as overrides."""
    if not isinstance(spec, dict):
        return spec
    name = spec.get("task") if isinstance(spec.get("task"), str) else spec.get("group")
    entry = tm.task_index.get(name) if isinstance(name, str) else None
    if entry is None or entry.yaml_path is None:
        return spec  # an inline task of the user's own
    overrides = {k: v for k, v in spec.items() if k != "group"}
    return tm._factory.build(entry, overrides=overrides, registry=tm._index)


def build_instances(loaded: Loaded, *, limit: int | None, num_fewshot: int | None, fewshot_seed: int,
                    system_instruction: str | None, apply_chat_template: bool) -> None:
    """Each task's requests, as lm-eval's simple_evaluate + evaluate build them (its num_fewshot default of
    0, its few-shot seed), grouped by document."""
    for name, task in loaded.tasks.items():
        if num_fewshot is not None and task.get_config("num_fewshot") != 0:
            task.set_config(key="num_fewshot", value=num_fewshot)
        elif task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=fewshot_seed)
        if apply_chat_template and (task.OUTPUT_TYPE != "generate_until" or task.config.gen_prefix):
            raise LmEvalError(f"task.apply_chat_template=true: lm-eval task {name!r} is {task.OUTPUT_TYPE}"
                              f"{' with a gen_prefix' if task.config.gen_prefix else ''}; fp8eval applies chat "
                              f"templates to generate_until tasks without gen_prefix only")
        task.build_all_requests(limit=limit, rank=0, world_size=1, system_instruction=system_instruction,
                                apply_chat_template=apply_chat_template, fewshot_as_multiturn=apply_chat_template,
                                chat_template=_messages_as_json if apply_chat_template else None)
        by_doc: dict[int, list[Any]] = {}
        for inst in task.instances:
            by_doc.setdefault(inst.doc_id, []).append(inst)
        for insts in by_doc.values():
            insts.sort(key=lambda i: i.idx)
        loaded.instances[name] = by_doc


def _messages_as_json(history: list[dict], add_generation_prompt: bool = True) -> str:
    """lm-eval's chat_template callback: the messages themselves (as JSON), so fp8eval's engine applies the
    model's own template exactly as for every other task."""
    return json.dumps(history, ensure_ascii=False)


def config_hash(task: Any) -> str:
    """sha256 of the task's full config as lm-eval dumps it (functions by their source), with local data
    files named by content rather than by path."""
    cfg = task.dump_config()
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if files:
        cfg["dataset_kwargs"] = dict(cfg["dataset_kwargs"], data_files=_content_names(files))
    text = _ADDRESS.sub("", json.dumps(cfg, sort_keys=True, default=str, ensure_ascii=False))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _content_names(files: Any) -> Any:
    if isinstance(files, str):
        p = Path(files)
        return f"sha256:{file_sha256(p)}" if p.is_file() else files
    if isinstance(files, list):
        return [_content_names(f) for f in files]
    if isinstance(files, dict):
        return {k: _content_names(v) for k, v in files.items()}
    return files
