"""One calibration: load, tokenize, llm-compressor one-shot, save the checkpoint atomically."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from fp8eval.calibrate.config import CalibConfig, CalibrationError, validate
from fp8eval.calibrate.data import TokenizedSet, load_rows, resolve_dataset, select_rows, tokenize_rows
from fp8eval.calibrate.kvstats import collect_kv_stats_unquantized
from fp8eval.calibrate.report import write_report
from fp8eval.calibrate.store import _point_latest, cache_key, cache_root, checkpoint_dir, key_hash
from fp8eval.config import ModelConfig
from fp8eval.models import local_model_dir
from fp8eval.scales import load_kv_scales, save_kv_scales_json


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


# --- the whole thing ------------------------------------------------------------------------------------
def _model_dir(model: ModelConfig):
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
