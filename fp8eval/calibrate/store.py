"""Where calibrations live: the cache key, checkpoint directories and the LATEST pointers that
`${calibrated:<strategy>}` resolves to."""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Optional

from fp8eval.calibrate.config import CALIB_SCHEMA, CalibConfig, CalibrationError
from fp8eval.calibrate.data import DatasetSource
from fp8eval.config import ModelConfig
from fp8eval.core.paths import cache_root as fp8eval_cache


# --- where things live ---------------------------------------------------------------------------------
def cache_root(calib: CalibConfig) -> Path:
    if calib.cache_dir:
        return Path(calib.cache_dir).expanduser()
    return fp8eval_cache() / "calibrated"


def latest_pointer(root: Path, model_name: str, strategy: str) -> Path:
    return root / model_name / f"LATEST-{strategy}"


def latest_checkpoint(model_name: str, strategy: str, root: Path | None = None) -> Path:
    """The checkpoint of the last successful `calibrate` for this model and strategy."""
    root = root if root is not None else cache_root(CalibConfig())
    pointer = latest_pointer(root, model_name, strategy)
    if pointer.is_file():
        path = root / model_name / pointer.read_text(encoding="utf-8").strip()
        if (path / "calibration.json").is_file():
            return path
    raise CalibrationError(
        f"kv.scales needs a scales source: no calibrated {strategy} KV scales for model {model_name!r} "
        f"under {root}. Make them with "
        f"`python -m fp8eval.calibrate model={model_name} calib.strategy={strategy}` (offline: add "
        f"calib=offline), or set kv.scales=PATH to a checkpoint or scales JSON."
    )



def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def model_key(model: ModelConfig) -> dict:
    return {
        "hf_id": model.hf_id,
        "revision": model.revision,
        "embedded_package": model.embedded_package,
        "embedded_version": _version(model.embedded_package.replace("_", "-")) if model.embedded_package else None,
        "gguf_file": model.gguf_file,
        "chat_template": model.chat_template,
    }


def cache_key(model: ModelConfig, calib: CalibConfig, data: DatasetSource) -> dict:
    """Everything that can change a scale (cache_dir, threads, report and force cannot)."""
    return {
        "schema": CALIB_SCHEMA,
        "model": model_key(model),
        "strategy": calib.strategy,
        "dataset": data.key(),
        "samples": calib.samples,
        "seq_len": calib.seq_len,
        "seed": calib.seed,
        "observer": calib.observer,
        "pipeline": calib.pipeline,
        "dtype": calib.dtype,
        "versions": {d: _version(d) for d in ("llmcompressor", "compressed-tensors", "transformers", "torch")},
    }


def key_hash(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def checkpoint_dir(root: Path, model: ModelConfig, calib: CalibConfig, key: dict) -> Path:
    return root / model.name / f"{calib.strategy}-{key_hash(key)[:16]}"


# --- K/V statistics (independent of llm-compressor) -----------------------------------------------------


def _point_latest(root: Path, model_name: str, strategy: str, out: Path) -> None:
    pointer = latest_pointer(root, model_name, strategy)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    tmp = pointer.with_name(pointer.name + f".tmp{os.getpid()}")
    tmp.write_text(out.name + "\n", encoding="utf-8")
    os.replace(tmp, pointer)
