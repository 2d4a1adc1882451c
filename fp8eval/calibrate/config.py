"""Calibration settings (typed, validated) and the shipped presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from fp8eval.config import ModelConfig
from fp8eval.core.paths import TASK_DATA_ROOT
from fp8eval.scales import STRATEGIES

CALIB_SCHEMA = "fp8eval-calib/1"
SHIPPED_DATA = TASK_DATA_ROOT / "calibration"
PIPELINES = ("independent", "sequential", "basic")
# Smallest normal e4m3 value: below it (at scale 1.0) a value keeps fewer than 3 mantissa bits.
FP8_E4M3_MIN_NORMAL = 2.0**-6


@dataclass
class CalibConfig:
    strategy: str = "tensor"  # tensor | attn_head
    # A preset (ultrachat_200k, haystack_chat), a local .jsonl/.json/.parquet file, or a hub dataset id.
    dataset: str = "ultrachat_200k"
    split: Optional[str] = None  # hub split; presets set their own
    dataset_revision: Optional[str] = None  # hub dataset revision (commit) to pin
    samples: int = 512  # llm-compressor's example default
    seq_len: int = 2048  # tokens per sample; longer samples are cut (counted in the report)
    seed: int = 42  # picks which rows (sha256 permutation, fp8eval.seeds)
    # llm-compressor observer for k/v. null = its default for activations ("minmax": a moving average of
    # per-batch min/max, averaging constant 0.01); "static_minmax" = the absolute max over all samples.
    observer: Optional[str] = None
    pipeline: str = "independent"  # llm-compressor's default (sequential for this modifier) | sequential | basic
    dtype: str = "auto"  # dtype the model is loaded in for calibration (auto = the checkpoint's)
    threads: Optional[int] = None  # torch CPU threads (1 is much faster on a busy 2-core machine)
    cache_dir: Optional[str] = None  # default: $FP8EVAL_CACHE/calibrated (~/.cache/fp8eval/calibrated)
    report: bool = True  # measure K/V statistics and write scales_report.md / .png
    force: bool = False  # recalibrate even when the cache has this key


@dataclass
class CalibrateConfig:
    model: ModelConfig = MISSING
    calib: CalibConfig = field(default_factory=CalibConfig)


# Presets: name -> where the rows come from. The hub default is llm-compressor's own example data.
PRESETS: dict[str, dict[str, Any]] = {
    "ultrachat_200k": {"kind": "hub", "id": "HuggingFaceH4/ultrachat_200k", "split": "train_sft"},
    "haystack_chat": {"kind": "file", "path": str(SHIPPED_DATA / "haystack_chat.jsonl")},
}


class CalibrationError(RuntimeError):
    """Calibration cannot proceed; the message says why and what to do."""



# --- validation ----------------------------------------------------------------------------------------
def validate(calib: CalibConfig) -> None:
    def bad(key: str, value: Any, valid: str) -> CalibrationError:
        return CalibrationError(f"calib.{key}={value!r} is not valid; {valid}")

    if calib.strategy not in STRATEGIES:
        raise bad("strategy", calib.strategy, f"valid: {', '.join(STRATEGIES)}")
    if calib.pipeline not in PIPELINES:
        raise bad("pipeline", calib.pipeline, f"valid: {', '.join(PIPELINES)}")
    for key in ("samples", "seq_len"):
        if getattr(calib, key) < 1:
            raise bad(key, getattr(calib, key), "must be >= 1")
    if calib.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise bad("dtype", calib.dtype, "valid: auto, float32, bfloat16, float16")


def unknown_calib_keys(overrides: list[str]) -> str | None:
    """A misspelt `calib.x=` override, with the valid keys (Hydra would only say the key is missing)."""
    valid = {f.name for f in dataclasses.fields(CalibConfig)}
    for arg in overrides:
        key = arg.split("=", 1)[0].lstrip("+~")
        if key.startswith("calib.") and key.split(".")[1] not in valid:
            return f"unknown key {key!r}; valid keys under calib: {', '.join(sorted(valid))}"
    return None


# --- data ----------------------------------------------------------------------------------------------
