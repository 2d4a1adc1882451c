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

import hydra
from omegaconf import DictConfig, OmegaConf

from fp8eval.calibrate.config import CalibConfig, CalibrateConfig, CalibrationError, unknown_calib_keys
from fp8eval.calibrate.run import calibrate
from fp8eval.core.errors import Fp8evalError
from fp8eval.core.paths import CONF_DIR
from fp8eval.core.secrets import guard_std_streams
from fp8eval.registry import register_wing
from fp8eval.validate import validate_config


def register() -> None:
    """ConfigStore: the shared groups, `calibrate_schema` (conf/calibrate.yaml) and `schema/calib/calib`."""
    register_wing("calibrate_schema", CalibrateConfig, {"schema/calib/calib": CalibConfig})


register()


def main() -> None:
    """The Hydra app; the checkpoint directory is the last stdout line."""

    @hydra.main(config_path=str(CONF_DIR), config_name="calibrate", version_base="1.3")
    def app(cfg: DictConfig) -> None:
        typed: CalibrateConfig = OmegaConf.to_object(cfg)
        try:
            validate_config(typed)  # every wing's one check, before any model loads
            path = calibrate(typed.model, typed.calib, log=lambda m: print(m, file=sys.stderr))
        except (CalibrationError, Fp8evalError) as e:
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
    guard_std_streams()  # every line printed, Hydra's errors included, is redacted (fp8eval.core.secrets)
    main()
