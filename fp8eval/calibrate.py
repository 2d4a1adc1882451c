"""`python -m fp8eval.calibrate`: calibrated FP8 KV-cache scales with llm-compressor, cached.

    python -m fp8eval.calibrate model=smollm2-135m calib.strategy=tensor|attn_head \
        calib.dataset=ultrachat_200k|haystack_chat|PATH.jsonl|PATH.parquet calib.samples=512 calib.seq_len=2048

Runs llm-compressor's one-shot calibration with only a `kv_cache_scheme` (8-bit float, strategy tensor or
attn_head), writes the compressed-tensors checkpoint (vLLM loads it with kv_cache_dtype=fp8; the reference
engine reads its k_scale/v_scale) into a cache directory keyed by everything that can change a scale, and
prints that directory as the last stdout line. A rerun with the same key finds it and calibrates nothing.
Next to the checkpoint: `kv_scales.json` (the same scales, `fp8eval-kv-scales/1`), `calibration.json`
(the key and what was measured) and `scales_report.md` + `scales_report.png`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING

from fp8eval.config import ModelConfig
from fp8eval.scales import FP8_E4M3_MAX, STRATEGIES, KVScales, load_kv_scales, save_kv_scales_json

CALIB_SCHEMA = "fp8eval-calib/1"
REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED_DATA = REPO_ROOT / "tasks" / "calibration"
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


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore

    from fp8eval.config import register_configs as register_run_configs

    register_run_configs()  # model options extend /schema/model/model
    cs = ConfigStore.instance()
    cs.store(name="calibrate_schema", node=CalibrateConfig)
    cs.store(group="schema/calib", name="calib", node=CalibConfig)


# --- where things live ---------------------------------------------------------------------------------
def cache_root(calib: CalibConfig) -> Path:
    if calib.cache_dir:
        return Path(calib.cache_dir).expanduser()
    from fp8eval.models import cache_root as fp8eval_cache

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


def register_resolvers() -> None:
    """`${calibrated:tensor}` in a kv option = the latest calibrated checkpoint of the run's model."""
    from omegaconf import OmegaConf

    def calibrated(strategy: str, *, _root_) -> str:
        return str(latest_checkpoint(str(_root_.model.name), strategy))

    if not OmegaConf.has_resolver("calibrated"):
        OmegaConf.register_new_resolver("calibrated", calibrated)


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
@dataclass
class DatasetSource:
    kind: str  # hub | file
    id: str  # hub id or resolved file path
    split: Optional[str] = None
    revision: Optional[str] = None
    sha256: Optional[str] = None  # of a local file's bytes

    def key(self) -> dict:
        return dataclasses.asdict(self) if self.kind == "hub" else {"kind": "file", "sha256": self.sha256,
                                                                      "name": Path(self.id).name}


def resolve_dataset(calib: CalibConfig) -> DatasetSource:
    spec = PRESETS.get(calib.dataset)
    if spec is None:
        path = Path(calib.dataset).expanduser()
        if path.suffix in (".jsonl", ".json", ".parquet"):
            spec = {"kind": "file", "path": str(path)}
        elif path.exists():
            raise CalibrationError(f"calib.dataset={calib.dataset!r}: local data must be .jsonl, .json or .parquet")
        else:
            spec = {"kind": "hub", "id": calib.dataset, "split": "train"}
    if spec["kind"] == "file":
        path = Path(spec["path"]).resolve()
        if not path.is_file():
            raise CalibrationError(f"calibration data {path} does not exist")
        from fp8eval.tasks.base import file_sha256

        return DatasetSource("file", str(path), sha256=file_sha256(path))
    return DatasetSource("hub", spec["id"], split=calib.split or spec["split"], revision=calib.dataset_revision)


def load_rows(src: DatasetSource):
    """Rows (anything with len() and [i] -> dict) holding `messages` (a chat) or `text`."""
    if src.kind == "hub":
        try:
            import datasets
        except ImportError as e:
            raise CalibrationError("hub calibration data needs the `datasets` package (pip install datasets)") from e
        try:
            return datasets.load_dataset(src.id, split=src.split, revision=src.revision)
        except Exception as e:
            raise CalibrationError(
                f"cannot load hub dataset {src.id} split {src.split}: {type(e).__name__}: {e}. Offline? Use the "
                f"shipped set (calib=offline or calib.dataset=haystack_chat) or a local .jsonl/.parquet."
            ) from e
    path = Path(src.id)
    if path.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict(orient="records")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        rows = json.loads(text)
        if not isinstance(rows, list):
            raise CalibrationError(f"{path}: a .json calibration file must hold a list of rows")
        return rows
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def select_rows(n_rows: int, samples: int, seed: int, dataset_key: dict) -> list[int]:
    """Which rows calibrate: a sha256-driven permutation of all rows, first `samples` of it."""
    from fp8eval.seeds import permutation

    if samples > n_rows:
        raise CalibrationError(
            f"calib.samples={samples} but the calibration data has only {n_rows} rows; lower calib.samples "
            f"or use a larger dataset"
        )
    key = json.dumps(dataset_key, sort_keys=True)
    return permutation(n_rows, "calib", key, seed)[:samples]


def row_text(row: dict, tokenizer, use_chat_template: bool) -> tuple[str, bool]:
    """(text, whether special tokens still need adding)."""
    if "messages" in row and row["messages"] is not None:
        messages = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
        if use_chat_template and getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(messages, tokenize=False), False
        return "\n\n".join(m["content"] for m in messages), True
    if "text" in row and isinstance(row["text"], str):
        return row["text"], True
    raise CalibrationError(f"a calibration row needs `messages` (a chat) or `text`; got keys {sorted(row)}")


@dataclass
class TokenizedSet:
    input_ids: list[list[int]]
    row_indices: list[int]
    n_truncated: int
    n_tokens: int


def tokenize_rows(rows, indices: list[int], tokenizer, seq_len: int, use_chat_template: bool) -> TokenizedSet:
    ids, truncated = [], 0
    for i in indices:
        text, add_special = row_text(dict(rows[i]), tokenizer, use_chat_template)
        toks = tokenizer(text, add_special_tokens=add_special)["input_ids"]
        if len(toks) > seq_len:
            truncated += 1
            toks = toks[:seq_len]  # calibration length, as llm-compressor's max_seq_length; reported
        if not toks:
            raise CalibrationError(f"calibration row {i} tokenizes to nothing")
        ids.append(list(toks))
    return TokenizedSet(ids, list(indices), truncated, sum(len(t) for t in ids))


# --- the cache key ---------------------------------------------------------------------------------------
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
@dataclass
class KVStats:
    """Per layer, per KV head, over all calibration tokens; k after rotary embedding, as cached."""

    amax: dict[str, dict[int, list[float]]]  # "k"/"v" -> layer -> [H_kv]
    n_values: dict[str, dict[int, list[int]]]
    n_saturate_at_1: dict[str, dict[int, list[int]]]  # |x| > 448: clipped by uncalibrated FP8
    n_clip_at_scale: dict[str, dict[int, list[int]]]  # |x| > 448 s: clipped at the calibrated scale
    n_subnormal_at_1: dict[str, dict[int, list[int]]]  # 0 < |x| < 2^-6: fewer mantissa bits at scale 1.0
    rel_err_at_1: dict[str, dict[int, float]]  # ||x - fp8(x)|| / ||x|| at scale 1.0, whole layer
    rel_err_at_scale: dict[str, dict[int, float]]  # the same at the calibrated scale


def collect_kv_stats(model, input_ids: list[list[int]], scales: KVScales) -> KVStats:
    """One forward per sample with a cache that records what attention stores: the keys and values as
    handed to the cache (post-rotary, post k-norm), which is what llm-compressor observes and vLLM caches."""
    import torch
    from transformers import DynamicCache

    from fp8eval.quant import fp8_roundtrip

    acc: dict[str, dict[int, dict[str, torch.Tensor]]] = {"k": {}, "v": {}}
    table_of = {"k": scales.k, "v": scales.v}

    def record(which: str, layer: int, x: torch.Tensor) -> None:
        x = x.detach().float()  # [B, H_kv, T, D]
        a = x.abs()
        dims = (0, 2, 3)
        s = table_of[which][layer].to(x.device)
        limit = FP8_E4M3_MAX * (s.reshape(1, -1, 1, 1) if s.ndim else s)
        new = {
            "amax": a.amax(dim=dims),
            "n": torch.full((x.shape[1],), a[:, :1].numel(), dtype=torch.float64),
            "sat": (a > FP8_E4M3_MAX).sum(dim=dims).double(),
            "clip": (a > limit).sum(dim=dims).double(),
            "sub": ((a > 0) & (a < FP8_E4M3_MIN_NORMAL)).sum(dim=dims).double(),
            "err2_1": ((x - fp8_roundtrip(x, 1.0, "e4m3")) ** 2).sum().double().reshape(1),
            "err2_s": ((x - fp8_roundtrip(x, s, "e4m3")) ** 2).sum().double().reshape(1),
            "sig2": (x**2).sum().double().reshape(1),
        }
        old = acc[which].get(layer)
        if old is None:
            acc[which][layer] = new
        else:
            old["amax"] = torch.maximum(old["amax"], new["amax"])
            for k in new:
                if k != "amax":
                    old[k] = old[k] + new[k]

    class StatsCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            record("k", layer_idx, key_states)
            record("v", layer_idx, value_states)
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    device = next(model.parameters()).device
    with torch.no_grad():
        for ids in input_ids:
            x = torch.tensor([ids], device=device)
            model(input_ids=x, past_key_values=StatsCache(config=model.config), use_cache=True)

    def table(field_name: str, cast):
        return {w: {l: [cast(v) for v in d[field_name].tolist()] for l, d in sorted(acc[w].items())} for w in acc}

    def rel(err: str):
        return {w: {l: float((d[err] / d["sig2"].clamp_min(1e-30)).sqrt()) for l, d in sorted(acc[w].items())}
                for w in acc}

    return KVStats(
        amax=table("amax", float),
        n_values=table("n", int),
        n_saturate_at_1=table("sat", int),
        n_clip_at_scale=table("clip", int),
        n_subnormal_at_1=table("sub", int),
        rel_err_at_1=rel("err2_1"),
        rel_err_at_scale=rel("err2_s"),
    )


def collect_kv_stats_unquantized(model, input_ids: list[list[int]], scales: KVScales) -> KVStats:
    """After one-shot the attention modules fake-quantize K/V in their forward; switched off here, the
    statistics are those of the unquantized model (what the BF16 baseline caches)."""
    from llmcompressor.utils.helpers import DisableQuantization

    with DisableQuantization(model):
        return collect_kv_stats(model, input_ids, scales)


# --- llm-compressor ---------------------------------------------------------------------------------------
def _require_llmcompressor():
    try:
        import llmcompressor  # noqa: F401
        from compressed_tensors.quantization import QuantizationArgs  # noqa: F401
    except ImportError as e:
        raise CalibrationError(
            "calibration needs llm-compressor: pip install 'fp8eval[calibrate]' "
            "(llmcompressor==0.14.0.1, which pins transformers<=5.17.0 and torch<=2.14)"
        ) from e


def run_oneshot(model, tokenized: TokenizedSet, calib: CalibConfig) -> None:
    """llm-compressor one-shot with only a kv_cache_scheme: weights untouched, k/v scales observed."""
    from compressed_tensors.quantization import QuantizationArgs
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    kv_args = QuantizationArgs(num_bits=8, type="float", strategy=calib.strategy, symmetric=True, dynamic=False,
                               observer=calib.observer)
    recipe = QuantizationModifier(targets=[], kv_cache_scheme=kv_args)
    ds = Dataset.from_list([{"input_ids": ids, "attention_mask": [1] * len(ids)} for ids in tokenized.input_ids])
    oneshot(
        model=model,
        dataset=ds,
        recipe=recipe,
        num_calibration_samples=len(tokenized.input_ids),
        max_seq_length=calib.seq_len,
        # Rows are already picked by our seed. Unshuffled, llm-compressor feeds them longest first.
        shuffle_calibration_samples=False,
        pipeline=calib.pipeline,
        # One sample per batch: its batching collator cuts every sample to the shortest in the batch, and
        # padding would put pad-token K/V into the observed ranges.
        batch_size=1,
    )


# --- the report -----------------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    return f"{x:.4g}"


def risk_summary(stats: KVStats) -> list[str]:
    lines = []
    for which, name in (("k", "K"), ("v", "V")):
        n = sum(sum(v) for v in stats.n_values[which].values())
        sat = sum(sum(v) for v in stats.n_saturate_at_1[which].values())
        clip = sum(sum(v) for v in stats.n_clip_at_scale[which].values())
        sub = sum(sum(v) for v in stats.n_subnormal_at_1[which].values())
        amax = max(max(v) for v in stats.amax[which].values())
        worst = max(stats.rel_err_at_1[which].items(), key=lambda kv: kv[1])
        worst_s = max(stats.rel_err_at_scale[which].items(), key=lambda kv: kv[1])
        sat_layers = sorted(l for l, v in stats.n_saturate_at_1[which].items() if sum(v))
        lines.append(
            f"- **{name}**: max |{name.lower()}| = {_fmt(amax)} over {n:,} values. At scale 1.0: "
            f"{sat:,} ({_fmt(100 * sat / n)}%) saturate (|x| > 448)"
            + (f" in layers {sat_layers}" if sat_layers else "")
            + f", {_fmt(100 * sub / n)}% are subnormal (< 2^-6, fewer than 3 mantissa bits), worst layer "
            f"round-trip error {_fmt(100 * worst[1])}% (layer {worst[0]}). At the calibrated scales: {clip:,} "
            f"({_fmt(100 * clip / n)}%) clip, worst layer error {_fmt(100 * worst_s[1])}% (layer {worst_s[0]})."
        )
    any_sat = any(sum(v) for w in ("k", "v") for v in stats.n_saturate_at_1[w].values())
    any_clip = any(sum(v) for w in ("k", "v") for v in stats.n_clip_at_scale[w].values())
    if any_sat:
        lines.append("- **Verdict: uncalibrated FP8 (scale 1.0) clips real values of this model: calibrate.**")
    elif any_clip:
        lines.append(
            "- **Verdict: nothing saturates at scale 1.0, but these calibrated scales clip the largest "
            "values** (a moving-average observer sits below the maximum). Calibrated and uncalibrated FP8 "
            "trade range for precision differently here; only an evaluation says which is better "
            "(`calib.observer=static_minmax` gives scales that clip nothing seen in calibration)."
        )
    else:
        lines.append(
            "- **Verdict: nothing saturates at scale 1.0 and nothing clips at the calibrated scales**; "
            "calibration can still help where many values are subnormal at scale 1.0 (small amax)."
        )
    return lines


def write_report(out_dir: Path, scales: KVScales, stats: KVStats, key: dict, tokenized: TokenizedSet,
                 model_name: str) -> None:
    per_head = scales.strategy == "attn_head"
    rows = []
    for layer in scales.layers:
        cells = [str(layer)]
        for which, sc in (("k", scales.k), ("v", scales.v)):
            s = sc[layer].reshape(-1).tolist()
            amax = stats.amax[which].get(layer, [float("nan")])
            amax_t = max(amax)
            if per_head:
                head = [a / (FP8_E4M3_MAX * x) for a, x in zip(amax, s)]
                cells += [" ".join(_fmt(x) for x in s), _fmt(amax_t), " ".join(f"{h:.2f}" for h in head)]
            else:
                cells += [_fmt(s[0]), _fmt(amax_t), f"{amax_t / (FP8_E4M3_MAX * s[0]):.2f}"]
            cells += [str(sum(stats.n_saturate_at_1[which].get(layer, [0]))),
                      str(sum(stats.n_clip_at_scale[which].get(layer, [0]))),
                      f"{100 * stats.rel_err_at_1[which].get(layer, float('nan')):.2f}",
                      f"{100 * stats.rel_err_at_scale[which].get(layer, float('nan')):.2f}"]
        rows.append("| " + " | ".join(cells) + " |")
    scale_col = "scales (per head)" if per_head else "scale"
    header = (
        f"| layer | k {scale_col} | k amax | k amax/(448·s) | k sat@1.0 | k clip@s | k err@1.0 % | k err@s % "
        f"| v {scale_col} | v amax | v amax/(448·s) | v sat@1.0 | v clip@s | v err@1.0 % | v err@s % |\n"
        "|---:|---|---:|---|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---:|"
    )
    ds = key["dataset"]
    ds_name = ds.get("id") or ds.get("name")
    text = "\n".join([
        f"# FP8 KV scales report: {model_name}, strategy {scales.strategy}",
        "",
        f"Calibration: {len(tokenized.input_ids)} samples of `{ds_name}`"
        + (f" ({ds['split']})" if ds.get("split") else "")
        + f", {tokenized.n_tokens:,} tokens, seq_len {key['seq_len']} ({tokenized.n_truncated} samples cut to it), "
        f"seed {key['seed']}, observer `{key['observer'] or 'minmax (llm-compressor default)'}`, pipeline "
        f"`{key['pipeline']}`; llmcompressor {key['versions']['llmcompressor']}. Scales sha256 `{scales.sha256}`.",
        "",
        "A scale s stores x as fp8(x / s) and reads fp8 · s (vLLM and compressed-tensors semantics); "
        "llm-compressor sets s = amax / 448. Uncalibrated vLLM uses s = 1.0. amax is measured here over the "
        "same calibration tokens on the unquantized model, K after rotary embedding (as cached). `sat@1.0` = "
        "values with |x| > 448, which scale 1.0 clips; `clip@s` = values with |x| > 448·s, which the calibrated "
        "scale s clips; `err@…` = relative RMS error of the FP8 round trip at that scale; `amax/(448·s)` > 1 "
        "means the largest calibration values clip at the calibrated scale (a moving-average observer does "
        "that on purpose).",
        "",
        "## Summary",
        "",
        *risk_summary(stats),
        "",
        "![scales](scales_report.png)",
        "",
        "## Per layer",
        "",
        header,
        *rows,
        "",
    ])
    (out_dir / "scales_report.md").write_text(text, encoding="utf-8")
    plot_scales(out_dir / "scales_report.png", scales, stats, model_name)


def plot_scales(path: Path, scales: KVScales, stats: KVStats, model_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = scales.layers
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, which, sc in ((axes[0], "k", scales.k), (axes[1], "v", scales.v)):
        vals = [sc[l].reshape(-1).tolist() for l in layers]
        n_heads = len(vals[0])
        for h in range(n_heads):
            label = "calibrated scale" if n_heads == 1 else f"calibrated scale, head {h}"
            ax.plot(layers, [v[h] for v in vals], marker="o", ms=3, lw=1, label=label)
        ax.plot(layers, [max(stats.amax[which][l]) / FP8_E4M3_MAX for l in layers], ls="--", color="black",
                lw=1, label="measured amax / 448" + (" (max over heads)" if n_heads > 1 else ""))
        ax.axhline(1.0, color="red", lw=1, ls=":", label="uncalibrated scale 1.0")
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_title(f"{which.upper()} ({'after rotary, ' if which == 'k' else ''}as cached)")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("scale (log)")
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(f"FP8 KV scales: {model_name}, strategy {scales.strategy}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the whole thing ------------------------------------------------------------------------------------
def _model_dir(model: ModelConfig):
    from fp8eval.models import local_model_dir

    return local_model_dir(model)


def _load_model(model: ModelConfig, calib: CalibConfig):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _model_dir(model)
    rev = None if isinstance(src, Path) else model.revision
    tok = AutoTokenizer.from_pretrained(model.tokenizer or src, revision=rev if not model.tokenizer else None)
    dtype = "auto" if calib.dtype == "auto" else getattr(torch, calib.dtype)
    lm = AutoModelForCausalLM.from_pretrained(src, revision=rev, dtype=dtype)
    lm.eval()
    return lm, tok


def calibrate(model: ModelConfig, calib: CalibConfig, log=print) -> Path:
    """Calibrate (or find in the cache) and return the checkpoint directory."""
    validate(calib)
    data = resolve_dataset(calib)
    key = cache_key(model, calib, data)
    root = cache_root(calib)
    out = checkpoint_dir(root, model, calib, key)
    if (out / "calibration.json").is_file() and not calib.force:
        load_kv_scales(out).require_strategy(calib.strategy)  # a broken cache entry fails loudly
        _point_latest(root, model.name, calib.strategy, out)
        log(f"calibrate: cache hit {out}")
        return out
    _require_llmcompressor()
    if calib.threads:
        import torch

        torch.set_num_threads(calib.threads)

    t0 = time.time()
    rows = load_rows(data)
    indices = select_rows(len(rows), calib.samples, calib.seed, data.key())
    lm, tok = _load_model(model, calib)
    tokenized = tokenize_rows(rows, indices, tok, calib.seq_len, model.chat_template)
    log(f"calibrate: {len(indices)} samples, {tokenized.n_tokens:,} tokens "
        f"({tokenized.n_truncated} cut to seq_len {calib.seq_len})")
    run_oneshot(lm, tokenized, calib)

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    lm.save_pretrained(tmp, save_compressed=True)
    tok.save_pretrained(tmp)
    scales = load_kv_scales(tmp).require_strategy(calib.strategy)
    n_layers = lm.config.get_text_config().num_hidden_layers
    if len(scales.layers) != n_layers:
        raise CalibrationError(f"llm-compressor wrote scales for {len(scales.layers)} of {n_layers} layers")
    manifest = {
        "key": key,
        "key_sha256": key_hash(key),
        "model_name": model.name,
        "scales_sha256": scales.sha256,
        "samples": {"row_indices": tokenized.row_indices, "n_tokens": tokenized.n_tokens,
                    "n_truncated": tokenized.n_truncated},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(time.time() - t0, 1),
        "command": " ".join(sys.argv),
    }
    if calib.report:
        stats = collect_kv_stats_unquantized(lm, tokenized.input_ids, scales)
        manifest["stats"] = dataclasses.asdict(stats)
        write_report(tmp, dataclasses.replace(scales, source=str(out)), stats, key, tokenized, model.name)
    save_kv_scales_json(scales, tmp / "kv_scales.json", meta={"checkpoint": str(out), "key_sha256": key_hash(key)})
    (tmp / "calibration.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    _point_latest(root, model.name, calib.strategy, out)
    log(f"calibrate: wrote {out} in {time.time() - t0:.0f} s")
    return out


def _point_latest(root: Path, model_name: str, strategy: str, out: Path) -> None:
    pointer = latest_pointer(root, model_name, strategy)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    tmp = pointer.with_name(pointer.name + f".tmp{os.getpid()}")
    tmp.write_text(out.name + "\n", encoding="utf-8")
    os.replace(tmp, pointer)


def main() -> None:
    import hydra
    from omegaconf import DictConfig, OmegaConf

    register_configs()

    @hydra.main(config_path="../conf", config_name="calibrate", version_base="1.3")
    def app(cfg: DictConfig) -> None:
        typed: CalibrateConfig = OmegaConf.to_object(cfg)
        try:
            path = calibrate(typed.model, typed.calib, log=lambda m: print(m, file=sys.stderr))
        except CalibrationError as e:
            print(f"\nfp8eval.calibrate: {e}", file=sys.stderr)
            sys.exit(2)
        report = path / "scales_report.md"
        if report.is_file():
            print(f"report: {report}")
        print(path, flush=True)

    problem = unknown_calib_keys(sys.argv[1:])
    if problem:
        print(f"fp8eval.calibrate: {problem}", file=sys.stderr)
        sys.exit(2)
    app()


if __name__ == "__main__":
    main()
