"""`python -m fp8eval.calibrate`: calibrated FP8 KV-cache scales with llm-compressor, cached.

config (settings, presets) < data (rows) < store (cache keys, LATEST pointers) < kvstats (what the cache
would store) < report < run (the one-shot calibration); `__main__` is the CLI.
"""

from fp8eval.calibrate.config import (
                                      CALIB_SCHEMA,
                                      PIPELINES,
                                      PRESETS,
                                      SHIPPED_DATA,
                                      CalibConfig,
                                      CalibrateConfig,
                                      CalibrationError,
                                      unknown_calib_keys,
                                      validate,
)
from fp8eval.calibrate.data import (
                                      DatasetSource,
                                      TokenizedSet,
                                      load_rows,
                                      resolve_dataset,
                                      row_text,
                                      select_rows,
                                      tokenize_rows,
)
from fp8eval.calibrate.kvstats import KVStats, collect_kv_stats, collect_kv_stats_unquantized, risk_summary
from fp8eval.calibrate.report import plot_scales, write_report
from fp8eval.calibrate.run import calibrate, run_oneshot
from fp8eval.calibrate.store import (
                                      _point_latest,
                                      cache_key,
                                      cache_root,
                                      checkpoint_dir,
                                      key_hash,
                                      latest_checkpoint,
                                      latest_pointer,
                                      model_key,
)

__all__ = [
    "CALIB_SCHEMA", "PIPELINES", "PRESETS", "SHIPPED_DATA", "CalibConfig", "CalibrateConfig", "CalibrationError",
    "DatasetSource", "KVStats", "TokenizedSet", "_point_latest", "cache_key", "cache_root", "calibrate",
    "checkpoint_dir", "collect_kv_stats", "collect_kv_stats_unquantized", "key_hash", "latest_checkpoint",
    "latest_pointer", "load_rows", "model_key", "plot_scales", "resolve_dataset", "risk_summary", "row_text",
    "run_oneshot", "select_rows", "tokenize_rows", "unknown_calib_keys", "validate", "write_report",
]
