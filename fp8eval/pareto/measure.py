"""The divergence probe over many arms against one baseline: the baseline's passages computed once, each point's
once, each arm through its own engine (the divergence probe's fingerprints, caches and measures:
fp8eval.divergence.run / sources / measures), so a sweep of N formats costs N + 1 engine starts, not 2 N."""

from __future__ import annotations

import re
import time

from fp8eval.divergence import measures as M
from fp8eval.divergence import paths as P
from fp8eval.divergence import run as D
from fp8eval.divergence import sources

_CAPACITY = re.compile(r"KV cache size:\s*([\d,]+)\s*tokens")


class Probe:
    """The passages, the records root and the baseline arm's results."""

    def __init__(self, cfg, door, docs, records, out=print):
        self.cfg, self.door, self.docs, self.records, self.out = cfg, door, docs, records, out
        self.base: dict | None = None
        self.ref_engine = None
        self.kind = None

    def arm(self, arm) -> tuple[dict, dict]:
        """One arm's (an ArmSpec) per-passage results (cached by fingerprint) and what its engine said (preflight,
        capacity); the engine is opened and closed through the door (fp8eval.arms)."""
        engine = self.door.open(arm)
        kv = arm.kv
        info: dict = {}
        try:
            kind = sources.source_kind(engine)
            self.kind = kind
            path = P.primary(str(self.cfg.divergence.path))  # both: the frontier is drawn from the decode path
            fp, material = D.arm_fingerprint(self.cfg, engine, kv, kind, path=path)
            cache = D.ArmCache(self.records, fp, material)
            data = {}
            for p in self.docs:
                got = cache.load(p)
                if got is None:
                    t = time.perf_counter()
                    got = sources.compute(engine, p.ids, int(self.cfg.divergence.topk), path)
                    cache.save(p, got)
                    self.out(f"{arm.name}: {p.book} {p.length} tokens in {time.perf_counter() - t:.1f} s")
                data[p.key] = got
            info["fingerprint"], info["path"] = fp, path
            pre = engine.preflight
            if pre:
                info["preflight"] = {k: pre.get(k) for k in ("vllm_version", "cache_dtype", "attention_backend",
                                                             "kv_cache_dtype_skip_layers", "device_name")}
            caps = _CAPACITY.findall(engine.startup_log)
            if caps:
                info["kv_capacity_tokens"] = int(caps[-1].replace(",", ""))
        finally:
            if self.kind == "hidden":
                self.ref_engine = engine  # the shared model stays loaded for lm_head (closed with the door)
            else:
                self.door.close(engine)
        return data, info

    def baseline(self, arm) -> dict:
        """The baseline arm's results (computed on first use)."""
        if self.base is None:
            self.base, self.base_info = self.arm(arm)
        return self.base

    def compare(self, base: dict, var: dict) -> dict:
        """KL, top-1 agreement and |dlogp| per position bucket, as the divergence probe reports them."""
        edges = tuple(int(e) for e in self.cfg.divergence.edges)
        acc, topk_view = M.BucketAccumulator(edges=edges), M.BucketAccumulator(edges=edges)
        import contextlib

        import numpy as np

        with self.ref_engine.probe() if self.ref_engine is not None else contextlib.nullcontext() as probe:
            for p in self.docs:
                n_pos = p.length - 1
                main, approx = D.position_measures(base[p.key], var[p.key], probe, n_pos,
                                                   int(self.cfg.divergence.topk))
                pos = np.arange(n_pos)
                acc.add(pos, *main[:3])
                if approx is not None:
                    topk_view.add(pos, *approx[:3])
        res = {"overall": acc.overall(), "buckets": acc.result(),
               "method": "exact_full_vocabulary" if self.kind == "hidden" else "topk_shared_renormalised"}
        if topk_view.sums:
            res["topk_view"] = {"overall": topk_view.overall(), "buckets": topk_view.result()}
        return res
