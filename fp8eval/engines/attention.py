"""`engine.attention_backend`: the attention kernel as a first-class axis of a run.

How vLLM takes it depends on the version: newer vLLM has an `attention_backend` EngineArgs field
(`--attention-backend` for `vllm serve`, `AttentionConfig.backend`; present in 0.18.1's
`vllm/engine/arg_utils.py`), older vLLM read the `VLLM_ATTENTION_BACKEND` environment variable. fp8eval
asks the vLLM that will run (its own interpreter, FP8EVAL_VLLM_PYTHON or this one) whether EngineArgs has
the field and uses whichever that vLLM understands. The arm's engine args always carry the requested
backend, so it is in the fingerprint either way; after start-up the backend vLLM reports (its config, or
its "Using X backend" log line) must match, else the arm refuses to run.
"""

from __future__ import annotations

import functools
import re
import subprocess
from typing import Any

from fp8eval.engines.base import EngineError

# Backends this harness knows (vLLM's AttentionBackendEnum names); the first four are the axis.
BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLASHMLA", "FLASH_ATTN_MLA", "TRITON_MLA",
            "CUTLASS_MLA", "FLEX_ATTENTION", "CPU_ATTN", "TURBOQUANT", "FLASHMLA_SPARSE")
ENV_VAR = "VLLM_ATTENTION_BACKEND"
# Spellings seen in vLLM logs and configs (squashed: upper case, letters and digits only) -> enum name.
_ALIASES = {"FLASHATTN": "FLASH_ATTN", "FLASHATTENTION": "FLASH_ATTN", "FLASH": "FLASH_ATTN",
            "FLASHATTENTIONBACKEND": "FLASH_ATTN", "FLASHINFERBACKEND": "FLASHINFER",
            "TRITON": "TRITON_ATTN", "TRITONATTENTION": "TRITON_ATTN", "FLASHMLABACKEND": "FLASHMLA",
            "CPUATTN": "CPU_ATTN", "TORCHSDPA": "CPU_ATTN"}


def normalize(name: Any) -> str | None:
    """vLLM's enum name for a backend however it was spelt ('Flash Attention', 'FlashInfer', ...)."""
    if name is None:
        return None
    text = str(getattr(name, "name", name)).split(".")[-1]
    squashed = re.sub(r"[^A-Z0-9]", "", text.upper())
    for b in BACKENDS:
        if squashed == b.replace("_", ""):
            return b
    return _ALIASES.get(squashed, text.upper())


def validate(name: str | None) -> str | None:
    """The requested backend as vLLM names it; an unknown name fails with the valid ones."""
    if name in (None, ""):
        return None
    norm = normalize(name)
    if norm not in BACKENDS:
        raise EngineError(f"engine.attention_backend={name!r} is not a vLLM attention backend this harness "
                          f"knows; valid: {', '.join(BACKENDS)}.")
    return norm


@functools.cache
def has_engine_arg(python: str) -> bool:
    """Whether the vLLM importable by `python` has the `attention_backend` EngineArgs field. When vLLM
    cannot be imported there, True: the engine's own start-up then explains what is missing."""
    probe = ("import dataclasses\nfrom vllm.engine.arg_utils import EngineArgs\n"
             "print(int('attention_backend' in {f.name for f in dataclasses.fields(EngineArgs)}))")
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return True
    last = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
    return last != ["0"]


def for_launch(args: dict[str, Any], env: dict[str, str], python: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(engine args, environment) to start vLLM with: the backend as an engine arg where that vLLM has
    one, else as VLLM_ATTENTION_BACKEND. The caller's dicts are not changed."""
    backend = args.get("attention_backend")
    if not backend or has_engine_arg(python):
        return args, env
    args = {k: v for k, v in args.items() if k != "attention_backend"}
    return args, {**env, ENV_VAR: str(backend)}


def check(cfg, engine) -> dict[str, Any] | None:
    """After start-up: the requested backend against what the engine reports. Returns the arm summary's
    `attention_backend` entry ({requested, observed, verified}); None when neither is known. Raises when
    vLLM reports another backend than the one asked for."""
    requested = validate(getattr(cfg.engine, "attention_backend", None))
    d = engine.describe()
    kind = d.get("kind")
    if requested and kind not in ("vllm", "server"):
        raise EngineError(f"engine.attention_backend={requested} selects a vLLM kernel; engine={kind} has none. "
                          "Use engine=vllm or engine=server, or leave it unset.")
    observed = normalize((d.get("preflight") or {}).get("attention_backend"))
    if requested is None and observed is None:
        return None
    if requested and observed and observed != requested:
        raise EngineError(
            f"The arm asked for attention backend {requested} but vLLM runs {observed} (it may not support this "
            "model, head size or KV dtype with that backend). Refusing to record numbers under the wrong "
            "backend: pick a backend this model supports, or leave engine.attention_backend unset.")
    # An external server publishes no backend: the requested one is then declared, not verified.
    return {"requested": requested, "observed": observed, "verified": bool(requested and observed)}
