"""Run one regression-corpus case on an engine and say whether the audit caught it (and how)."""

from __future__ import annotations

import time
from pathlib import Path


def compose(overrides: list[str]):
    """The typed RunConfig of `python -m fp8eval` for these overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from fp8eval.core.paths import CONF_DIR
    from fp8eval.registry import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return OmegaConf.to_object(hydra_compose(config_name="config", overrides=overrides))


def case_overrides(case, d: Path, engine: str, on_cpu: bool = False) -> list[str]:
    """Hydra overrides that run `case`'s checkpoint `d` as one arm on `engine` (an engine option: vllm, vllm_cpu,
    reference): a case with
    scales runs as a calibrated arm (kv.scales = the checkpoint, as fp8_calibrated does)."""
    ov = ["model=smollm2-135m", f"model.hf_id={d}", "model.embedded_package=null", "model.gguf_file=null",
          "model.max_model_len=512", "model.chat_template=false", f"engine={engine}", "kv=fp8", "baseline=none"]
    if engine.startswith("vllm"):
        ov.append("++engine.engine_args.skip_tokenizer_init=true")
    ov.append(f"kv.engine_args.kv_cache_dtype={case.engine_args['kv_cache_dtype']}")
    if case.scales and case.engine_args["kv_cache_dtype"] != "auto":
        ov += [f"kv.scales={d}", f"kv.scale_strategy={case.scales}"]
    if case.backend and not (engine.startswith("vllm") and on_cpu):
        ov.append(f"engine.attention_backend={case.backend}")
    skip = case.engine_args.get("kv_cache_dtype_skip_layers")
    if skip:
        ov.append("+kv.engine_args.kv_cache_dtype_skip_layers=[" + ",".join(f"'{s}'" for s in skip) + "]")
    return ov


def check_case(case, d: Path, engine: str, extra: list[str] | None = None) -> dict:
    """{"case", "expected", "caught", "how", "problems"|"error"}: caught = the arm was refused with one of the
    expected categories (or, on vLLM, refused at start-up: loud, not silent, recorded as such)."""
    from fp8eval.arms import arm_spec, open_engines
    from fp8eval.engines.audit.compare import AuditError
    from fp8eval.engines.vllm.kvcheck import runs_on_cpu

    on_cpu = engine.startswith("vllm") and (engine == "vllm_cpu" or runs_on_cpu({}))
    cfg = compose(case_overrides(case, d, engine, on_cpu) + list(extra or []))
    out = {"case": case.name, "engine": engine, "expected": list(case.expected), "caught": False}
    t0 = time.monotonic()
    try:
        with open_engines(cfg) as door, door.engine(arm_spec(cfg, cfg.kv)) as eng:
            audit = eng.audit_now()  # an engine that audits when it loads (reference) loads now
            out.update(how="not caught: the arm started and passed the audit", audit=audit)
    except AuditError as e:
        cats = sorted({c for c in ("dtype", "scales", "backend", "skip") if f"[{c}]" in str(e)})
        out.update(caught=bool(set(cats) & set(case.expected)), how=f"audit refused it: {cats}", error=str(e)[:1200])
    except Exception as e:  # noqa: BLE001 - a loud start-up failure is not a silent one
        out.update(caught=True, how="refused at start-up (loud, not silent)", error=f"{type(e).__name__}: {e}"[:1200])
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out
