"""One divergence run: both arms prefill the same passages, the measures per position bucket, divergence.json.

Resumable and fingerprinted like the runner's arms: each (arm, passage) result is kept under
`<records_dir>/divergence/<fingerprint[:20]>/<passage key>.npz`, the fingerprint covering the model, the
engine's describe() (versions, kv settings, preflight), the kv config and what was kept (hidden states or
top-k); a rerun loads what exists and computes only what is missing.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from fp8eval.arms import ArmEngines, open_engines, resolve_arms
from fp8eval.config import KVConfig, kv_fingerprint_view
from fp8eval.core.hashing import canonical_json, fingerprint_hash
from fp8eval.core.secrets import redact_obj
from fp8eval.divergence import measures as M
from fp8eval.divergence import sources
from fp8eval.divergence.documents import Passage, load_tokenizer, passages
from fp8eval.engines import resolve_kind

SCHEMA = 1
TOPK_NOTE = ("KL over the tokens in both arms' top-k prompt_logprobs, both distributions renormalised to that "
             "shared set: it ignores the probability mass outside it, so it reads low (on the reference engine the "
             "full-vocabulary KL was 12-22 % above it for a K/V-only FP8 cache, issue 18). top1_agree compares the "
             "two arms' most likely tokens; dlogp_mean is over positions whose BF16 argmax is in the variant's top-k.")
EXACT_NOTE = "KL over the full vocabulary from both arms' logits (exact)."


def _plain(obj) -> dict:
    if dataclasses.is_dataclass(obj):
        return OmegaConf.to_container(OmegaConf.structured(obj), resolve=True)
    return dict(obj)


def arm_fingerprint(cfg, engine, kv: KVConfig, kind: str) -> tuple[str, dict]:
    """sha256 over everything that can change an arm's per-passage result."""
    model = _plain(cfg.model)
    for k in ("name", "notes", "sampling"):
        model.pop(k, None)
    kv_d = _plain(kv)
    for k in ("name", "description"):
        kv_d.pop(k, None)
    kv_d = kv_fingerprint_view(kv_d)
    material = {"divergence_schema": SCHEMA, "model": model, "engine": engine.describe(), "kv": kv_d,
                "kept": kind if kind == "hidden" else {"topk": int(cfg.divergence.topk)}}
    return fingerprint_hash(material), material


class ArmCache:
    """An arm's per-passage results on disk, named by fingerprint and passage key."""

    def __init__(self, root: Path, fingerprint: str, material: dict):
        self.dir = root / "divergence" / fingerprint[:20]
        self.dir.mkdir(parents=True, exist_ok=True)
        fp_file = self.dir / "fingerprint.json"
        if not fp_file.exists():
            fp_file.write_text(canonical_json({"fingerprint": fingerprint, "material": material}) + "\n")

    def path(self, p: Passage) -> Path:
        """The file of one passage's result."""
        return self.dir / f"{p.key}.npz"

    def load(self, p: Passage) -> dict | None:
        """One passage's cached result as {name: array}, or None when absent or unreadable."""
        try:
            with np.load(self.path(p)) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError):
            return None

    def save(self, p: Passage, data: dict) -> None:
        """Write one passage's result atomically (whole or absent)."""
        tmp = self.path(p).with_suffix(".tmp.npz")
        np.savez(tmp, **data)
        tmp.replace(self.path(p))  # whole or absent: a killed run never leaves half a result


def _engine_cfg(cfg):
    """vLLM returns at most max_logprobs (default 20) log-probs per position: raise it to topk."""
    if resolve_kind(cfg) == "vllm" and int(cfg.divergence.topk) > 20:
        args = dict(cfg.engine.engine_args)
        args.setdefault("max_logprobs", int(cfg.divergence.topk))
        cfg.engine.engine_args = args
    return cfg


def _topk_measures(base_ids, base_lp, var_ids, var_lp):
    args = (base_ids, base_lp, var_ids, var_lp)
    kl, n_shared = M.kl_from_topk(*args)
    return kl, M.top1_from_topk(*args), M.dlogp_from_topk(*args), n_shared


def _measures(base: dict, var: dict, ref_engine, n_pos: int, topk: int):
    """Per-position (kl, top1, dlogp, n_shared or None) over positions 0..n_pos-1; for the reference engine
    also the same measures from each arm's top-k only (what vLLM's prompt_logprobs would have given), so
    an emulation can be set against the real kernel on the same footing."""
    if "hidden" not in base:
        n = n_pos
        return _topk_measures(base["ids"][:n], base["logprobs"][:n], var["ids"][:n], var["logprobs"][:n]), None
    import torch

    ref_engine._load()  # a fully resumed run has not loaded the model yet
    vocab = ref_engine._model.get_output_embeddings().weight.shape[0]
    step = max(16, (1 << 24) // vocab)  # ~16M logits a slice per arm
    exact, approx = [], []
    for s in range(0, n_pos, step):
        lb = sources.logits_from_hidden(ref_engine, base["hidden"][s:min(s + step, n_pos)])
        lv = sources.logits_from_hidden(ref_engine, var["hidden"][s:min(s + step, n_pos)])
        exact.append((M.kl_from_logits(lb, lv), M.top1_from_logits(lb, lv), M.dlogp_from_logits(lb, lv)))
        tb = torch.log_softmax(lb.double(), -1).topk(topk, dim=-1)
        tv = torch.log_softmax(lv.double(), -1).topk(topk, dim=-1)
        approx.append(_topk_measures(tb.indices.cpu().numpy(), tb.values.cpu().numpy(),
                                     tv.indices.cpu().numpy(), tv.values.cpu().numpy()))
    cat = lambda parts, i: np.concatenate([p[i] for p in parts])  # noqa: E731
    return (cat(exact, 0), cat(exact, 1), cat(exact, 2), None), tuple(cat(approx, i) for i in range(4))


def run(cfg, run_dir: Path, out=print) -> dict:
    """Prefill every passage through the variant and the baseline arm, compare, write divergence.json."""
    with open_engines(cfg) as door:  # the reference engine's model stays loaded for the measures
        return _run(cfg, run_dir, door, out)


def _run(cfg, run_dir: Path, door: ArmEngines, out) -> dict:
    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    dcfg = cfg.divergence
    cfg = _engine_cfg(cfg)
    records = Path(cfg.records_dir).expanduser()
    records = records if records.is_absolute() else Path.cwd() / records
    arms = resolve_arms(cfg)  # [baseline, variant], or one arm compared with itself (fp8eval.arms)
    base_name, var_name = arms[0].name, arms[-1].name
    # vLLM needs room for one generated token after the prompt: a passage is at most max_model_len - 1.
    limit = int(cfg.model.max_model_len) - 1
    too_long = [n for n in dcfg.lengths if n > limit]
    if too_long:
        out(f"skipped lengths {too_long}: above model.max_model_len - 1 = {limit} (never truncated)")
    lengths = [n for n in dcfg.lengths if n <= limit]
    docs = passages(load_tokenizer(cfg.model), lengths, int(dcfg.documents))
    data: dict[str, dict[str, dict]] = {}
    arm_info: dict[str, dict] = {}
    ref_engine = None
    kind = None
    for arm in arms[::-1]:  # the variant first: a configuration the engine cannot serve fails early
        name = arm.name
        engine = door.open(arm)
        kind = None
        try:
            kind = sources.source_kind(engine)
            fp, material = arm_fingerprint(cfg, engine, arm.kv, kind)
            cache = ArmCache(records, fp, material)
            data[name], computed = {}, 0
            for p in docs:
                got = cache.load(p)
                if got is None:
                    t = time.perf_counter()
                    got = sources.compute(engine, p.ids, int(dcfg.topk))
                    cache.save(p, got)
                    computed += 1
                    out(f"{name}: {p.book} {p.length} tokens in {time.perf_counter() - t:.1f} s")
                data[name][p.key] = got
            arm_info[name] = {"fingerprint": fp, "cache": str(cache.dir), "passages_computed": computed,
                              "passages_reused": len(docs) - computed}
            if hasattr(engine, "preflight"):
                arm_info[name]["preflight"] = engine.preflight
        finally:
            if kind == "hidden":
                ref_engine = engine  # keeps the shared model for lm_head (closed with the door)
            else:
                door.close(engine)
    edges = tuple(int(e) for e in dcfg.edges)
    overall, by_length, topk_view = M.BucketAccumulator(edges=edges), {}, M.BucketAccumulator(edges=edges)
    shared_counts = []
    for p in docs:
        n_pos = p.length - 1  # the distribution after the last token predicts nothing in the passage
        main, approx = _measures(data[base_name][p.key], data[var_name][p.key], ref_engine, n_pos,
                                 int(dcfg.topk))
        kl, top1, dlogp, n_shared = main
        pos = np.arange(n_pos)
        overall.add(pos, kl, top1, dlogp)
        by_length.setdefault(p.length, M.BucketAccumulator(edges=edges)).add(pos, kl, top1, dlogp)
        if n_shared is not None:
            shared_counts.append(n_shared)
        if approx is not None:
            topk_view.add(pos, *approx[:3])
    result = {
        "model": cfg.model.name, "kv": var_name, "baseline": base_name, "engine": resolve_kind(cfg),
        "method": "exact_full_vocabulary" if kind == "hidden" else "topk_shared_renormalised",
        "topk": None if kind == "hidden" else int(dcfg.topk),
        "approximation": EXACT_NOTE if kind == "hidden" else TOPK_NOTE,
        "kl": "KL(baseline || variant) in nats, mean over positions",
        "buckets": overall.result(), "overall": overall.overall(),
        "by_length": {str(n): {"buckets": a.result(), "overall": a.overall()} for n, a in by_length.items()},
        "edges": list(edges),
        "passages": [{"length": p.length, "index": p.index, "book": p.book, "char_offset": p.char_offset,
                      "key": p.key} for p in docs],
        "arms": arm_info,
        "elapsed_s": round(time.perf_counter() - t0, 2),
    }
    if shared_counts:
        result["topk_shared_mean"] = float(np.mean(np.concatenate(shared_counts)))
    if topk_view.sums:
        # The same passages measured as a top-k engine would (comparable with engine=vllm's numbers).
        result["topk_view"] = {"topk": int(dcfg.topk), "method": "topk_shared_renormalised",
                               "buckets": topk_view.result(), "overall": topk_view.overall()}
    (run_dir / "divergence.json").write_text(json.dumps(redact_obj(result), indent=2) + "\n", encoding="utf-8")
    if dcfg.plot:
        try:
            from fp8eval.divergence.plot import plot_divergence

            plot_divergence(result, run_dir / "divergence.png")
        except ImportError as e:  # matplotlib is the `report` extra
            print(f"divergence: no plot ({e}); pip install matplotlib", file=sys.stderr)
    return result


def format_table(result: dict) -> str:
    """The per-bucket table printed at the end of a run."""
    head = f"{result['model']} {result['engine']}: {result['kv']} vs {result['baseline']} ({result['method']})"
    lines = [head, f"{'bucket':>10} {'n':>7} {'KL':>10} {'top1':>7} {'|dlogp|':>9}"]
    for label, b in [*result["buckets"].items(), ("overall", result["overall"])]:
        kl = "-" if b["kl_mean"] is None else f"{b['kl_mean']:.3e}"
        t1 = "-" if b["top1_agree"] is None else f"{b['top1_agree']:.3f}"
        dl = "-" if b["dlogp_mean"] is None else f"{b['dlogp_mean']:.3e}"
        lines.append(f"{label:>10} {b['n_tokens']:>7} {kl:>10} {t1:>7} {dl:>9}")
    return "\n".join(lines)
