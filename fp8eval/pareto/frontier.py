"""Pure functions of the pareto sweep: KV bytes per token, the frontier, the pick under a target, the serve line."""

from __future__ import annotations

import shlex

from fp8eval.core.kvformats import bytes_per_token_layer
from fp8eval.feasibility import Layout, layer_formats


def kv_bytes_per_token(layout: Layout, cache_dtype: str, skip: list) -> int:
    """KV cache bytes one token takes over all layers (skipped and boundary layers in BF16)."""
    return sum(bytes_per_token_layer(f, layout.n_kv_heads, layout.head_dim)
               for f in layer_formats(layout, cache_dtype, skip))


def frontier(points: list[dict], x: str = "kv_bytes_per_token", y: str = "kl") -> list[str]:
    """Keys of the points on the lower-left frontier of (x, y): no other point has x <= and y <= with one strictly
    smaller. Points without a y are left out."""
    have = [p for p in points if p.get(y) is not None and p.get(x) is not None]
    out = []
    for p in have:
        dominated = any(q[x] <= p[x] and q[y] <= p[y] and (q[x] < p[x] or q[y] < p[y]) for q in have)
        if not dominated:
            out.append(p["key"])
    return sorted(out, key=lambda k: next(p[x] for p in have if p["key"] == k))


def pick(points: list[dict], max_kl: float | None, min_recovery: float | None) -> tuple[dict | None, str]:
    """The smallest-memory feasible point meeting the targets (KL <= max_kl; recovery CI lower bound >=
    min_recovery), ties broken by lower KL; (None, why) when none meets them or no target is set."""
    if max_kl is None and min_recovery is None:
        return None, "no target set (pareto.max_kl or pareto.min_recovery)"
    ok = []
    for p in points:
        if not p.get("feasible") or p.get("kl") is None:
            continue
        if max_kl is not None and p["kl"] > max_kl:
            continue
        if min_recovery is not None:
            lo = (p.get("recovery") or {}).get("ci_low")
            if lo is None or lo < min_recovery:
                continue
        ok.append(p)
    if not ok:
        want = " and ".join(s for s in (f"KL <= {max_kl:g}" if max_kl is not None else "",
                                         f"recovery CI lower bound >= {min_recovery:g} %" if min_recovery is not None
                                         else "") if s)
        return None, f"no feasible configuration measured meets {want}"
    best = min(ok, key=lambda p: (p["kv_bytes_per_token"], p["kl"]))
    return best, "smallest KV bytes per token among the feasible points meeting the target"


def serve_line(model: str, engine_args: dict, extra: dict | None = None) -> str:
    """The exact `vllm serve` command line for a configuration (EngineArgs names -> flags)."""
    from fp8eval.engines.vllm.args import engine_args_to_flags

    args = {k: v for k, v in {**engine_args, **(extra or {})}.items() if v is not None}
    return " ".join(["vllm", "serve", shlex.quote(model), *(shlex.quote(str(f)) for f in engine_args_to_flags(args))])
