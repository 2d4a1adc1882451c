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

import sys
from pathlib import Path

from fp8eval.calibrate.config import CalibConfig, CalibrateConfig, CalibrationError, unknown_calib_keys
from fp8eval.calibrate.run import calibrate
from fp8eval.core.errors import Fp8evalError
from fp8eval.registry import register_wing
from fp8eval.wing import hydra_wing


def register() -> None:
    """ConfigStore: the shared groups, `calibrate_schema` (conf/calibrate.yaml) and `schema/calib/calib`."""
    register_wing("calibrate_schema", CalibrateConfig, {"schema/calib/calib": CalibConfig})


register()


def run_wing(typed: CalibrateConfig, run_dir: Path) -> None:
    """Calibrate (or find the cached checkpoint); the checkpoint directory is the last stdout line (a calibration
    error: one line, exit 2)."""
    path = calibrate(typed.model, typed.calib, log=lambda m: print(m, file=sys.stderr))
    report = path / "scales_report.md"
    if report.is_file():
        print(f"report: {report}")
    print(path, flush=True)


def _check(argv: list[str]) -> None:
    problem = unknown_calib_keys(argv)
    if problem:
        print(f"fp8eval.calibrate: {problem}", file=sys.stderr)
        sys.exit(2)


main = hydra_wing("fp8eval.calibrate", "calibrate", run_wing, errors=(CalibrationError, Fp8evalError), argv=_check)


if __name__ == "__main__":
    main()
