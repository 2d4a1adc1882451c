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

import fp8eval.control as controls
from fp8eval.arms import ArmEngines, open_engines, resolve_arms
from fp8eval.config import bf16_cache_spelling, kv_fingerprint_view
from fp8eval.core.hashing import canonical_json, fingerprint_hash
from fp8eval.core.secrets import redact_obj
from fp8eval.divergence import measures as M
from fp8eval.divergence import sources
from fp8eval.divergence.documents import Passage, load_tokenizer, passages, read_texts, text_passages
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


def arm_fingerprint(cfg, engine, kv, kind: str, control=None) -> tuple[str, dict]:
    """sha256 over everything that can change an arm's per-passage result (`kv`: a KVConfig or an ArmSpec;
    `control`: the control config of a control arm, None otherwise)."""
    model = _plain(cfg.model)
    for k in ("name", "notes", "sampling", "env"):
        model.pop(k, None)
    if not model.get("dummy"):
        model.pop("dummy", None)  # only dummy-weight runs carry it
    kv_d = _plain(getattr(kv, "kv", kv))
    for k in ("name", "description"):
        kv_d.pop(k, None)
    kv_d = kv_fingerprint_view(kv_d)
    kept: object = kind if kind == "hidden" else {"topk": int(cfg.divergence.topk)}
    if kind != "hidden" and int(getattr(cfg.divergence, "batch", 1)) != 1:  # only then: older results keep theirs
        kept = {**kept, "batch": int(cfg.divergence.batch)}
    material = {"divergence_schema": SCHEMA, "model": model, "engine": engine.describe(), "kv": kv_d, "kept": kept}
    material = bf16_cache_spelling(material, (kv_d.get("engine_args") or {}).get("dtype"))
    if control is not None:
        material["control"] = controls.material(control)
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


def _arms(cfg, out) -> tuple[list, dict | None]:
    """[baseline, variant(, control)] as ArmSpecs (one arm when the variant is the baseline), and the control's
    summary block. A BF16 variant whose engine args differ from the baseline's stays a second arm."""
    arms = resolve_arms(cfg)
    if len(arms) == 1:
        arms = [arms[0], arms[0]]  # the variant compared with itself (KL 0): one arm computed once
    control = controls.control_of(cfg)
    if control is None:
        return arms, None
    arms = controls.with_control_arm(cfg, arms)
    kind = resolve_kind(cfg)
    effects = controls.knob_effects(cfg, kind, arms[0], control, {"temperature": 0.0}, 1)
    for r in effects:  # prefill only: a batch cap matters only when passages go to vLLM together
        if r["knob"] == "engine_args.max_num_seqs" and int(cfg.divergence.batch) <= 1:
            r.update(effective=False, why="passages are prefilled one at a time (divergence.batch=1)")
        if r["knob"] == "seed_offset":
            r.update(effective=False, why="prefill only: nothing is sampled")
    effective = controls.check_effective(control, kind, effects)
    if not effective:
        out(f"note: control={control.name} changes nothing on the {kind} engine here (control.allow_inert=true)")
    return arms, controls.describe(control, kind, effects, effective)


def _compute_arm(cfg, engine, arm, docs, records: Path, out) -> tuple[dict, dict, str]:
    """Every passage through one arm, from its cache where kept: ({passage key: result}, arm info, kind)."""
    kind = sources.source_kind(engine)
    control = controls.control_of(cfg) if arm.role == controls.ROLE else None
    fp, material = arm_fingerprint(cfg, engine, arm, kind, control)
    cache = ArmCache(records, fp, material)
    got = {p.key: cache.load(p) for p in docs}
    todo = [p for p in docs if got[p.key] is None]
    batch = max(1, int(cfg.divergence.batch)) if kind == "topk" and hasattr(engine, "prompt_logprobs_many") else 1
    for i in range(0, len(todo), batch):
        part = todo[i:i + batch]
        t = time.perf_counter()
        if len(part) == 1:
            results = [sources.compute(engine, part[0].ids, int(cfg.divergence.topk))]
        else:
            results = [{"ids": np.asarray(a, dtype=np.int64), "logprobs": np.asarray(b, dtype=np.float32)}
                       for a, b in engine.prompt_logprobs_many([list(p.ids) for p in part], int(cfg.divergence.topk))]
        for p, r in zip(part, results):
            cache.save(p, r)
            got[p.key] = r
        out(f"{arm.name}: {len(part)} passage(s), {sum(p.length for p in part)} tokens in {time.perf_counter() - t:.1f} s")
    info = {"fingerprint": fp, "cache": str(cache.dir), "passages_computed": len(todo),
            "passages_reused": len(docs) - len(todo)}
    if hasattr(engine, "preflight"):
        info["preflight"] = engine.preflight
    return got, info, kind


def _compare(docs, base: dict, var: dict, ref_engine, edges, topk: int) -> dict:
    """The measures of one arm against the baseline over every passage: buckets, overall, by length, top-k view."""
    overall, by_length, topk_view = M.BucketAccumulator(edges=edges), {}, M.BucketAccumulator(edges=edges)
    shared_counts = []
    for p in docs:
        n_pos = p.length - 1  # the distribution after the last token predicts nothing in the passage
        main, approx = _measures(base[p.key], var[p.key], ref_engine, n_pos, topk)
        kl, top1, dlogp, n_shared = main
        pos = np.arange(n_pos)
        overall.add(pos, kl, top1, dlogp)
        by_length.setdefault(p.length, M.BucketAccumulator(edges=edges)).add(pos, kl, top1, dlogp)
        if n_shared is not None:
            shared_counts.append(n_shared)
        if approx is not None:
            topk_view.add(pos, *approx[:3])
    out = {"buckets": overall.result(), "overall": overall.overall(),
           "by_length": {str(n): {"buckets": a.result(), "overall": a.overall()} for n, a in by_length.items()}}
    if shared_counts:
        out["topk_shared_mean"] = float(np.mean(np.concatenate(shared_counts)))
    if topk_view.sums:
        # The same passages measured as a top-k engine would (comparable with engine=vllm's numbers).
        out["topk_view"] = {"topk": topk, "method": "topk_shared_renormalised",
                            "buckets": topk_view.result(), "overall": topk_view.overall()}
    return out


def _ratio(a, b):
    return None if a is None or not b else a / b


def run(cfg, run_dir: Path, out=print) -> dict:
    """Prefill every passage through the variant, the baseline (and a control) arm, compare, write divergence.json."""
    from fp8eval.validate import validate_config

    validate_config(cfg)  # before any engine is opened
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
    arms, control_info = _arms(cfg, out)
    base_arm, var_arm = arms[0], arms[1]
    # vLLM needs room for one generated token after the prompt: a passage is at most max_model_len - 1.
    limit = int(cfg.model.max_model_len) - 1
    too_long = [n for n in dcfg.lengths if n > limit]
    if too_long:
        out(f"skipped lengths {too_long}: above model.max_model_len - 1 = {limit} (never truncated)")
    lengths = [n for n in dcfg.lengths if n <= limit]
    tok = load_tokenizer(cfg.model)
    docs = passages(tok, lengths, int(dcfg.documents)) if int(dcfg.documents) > 0 else []
    text_counts = None
    if dcfg.texts:
        own, text_counts = text_passages(tok, read_texts(list(dcfg.texts)), [n for n in lengths])
        out(f"divergence.texts: {text_counts['texts']} text(s) -> {text_counts['passages']} passage(s) "
            f"({text_counts['used_whole']} used whole, shorter than every length; {text_counts['skipped_short']} "
            f"skipped, under 2 tokens)")
        docs += own
    if not docs:
        raise ValueError("divergence: no passage to measure (divergence.documents=0 and no divergence.texts)")
    data: dict[str, dict[str, dict]] = {}
    arm_info: dict[str, dict] = {}
    ref_engine = None
    kind = None
    order = {"baseline": 1, controls.ROLE: 2}
    # the variant first: a configuration the engine cannot serve fails early; each distinct arm once
    for arm in sorted({a.name: a for a in arms}.values(), key=lambda a: order.get(a.role, 0)):
        engine = door.open(arm)
        kind = None
        try:
            data[arm.name], arm_info[arm.name], kind = _compute_arm(cfg, engine, arm, docs, records, out)
        finally:
            if kind == "hidden":
                ref_engine = engine  # keeps the shared model for lm_head (closed with the door)
            else:
                door.close(engine)
    edges = tuple(int(e) for e in dcfg.edges)
    topk = int(dcfg.topk)
    main = _compare(docs, data[base_arm.name], data[var_arm.name], ref_engine, edges, topk)
    result = {
        "model": cfg.model.name, "kv": var_arm.name, "baseline": base_arm.name, "engine": resolve_kind(cfg),
        "method": "exact_full_vocabulary" if kind == "hidden" else "topk_shared_renormalised",
        "topk": None if kind == "hidden" else topk,
        "approximation": EXACT_NOTE if kind == "hidden" else TOPK_NOTE,
        "kl": "KL(baseline || variant) in nats, mean over positions",
        "buckets": main["buckets"], "overall": main["overall"], "by_length": main["by_length"],
        "edges": list(edges),
        "passages": [{"length": p.length, "index": p.index, "book": p.book, "char_offset": p.char_offset,
                      "key": p.key} for p in docs],
        "arms": arm_info,
        "elapsed_s": None,
    }
    for key in ("topk_shared_mean", "topk_view"):
        if key in main:
            result[key] = main[key]
    if control_info is not None:  # the noise floor: the control arm against the same baseline
        floor = _compare(docs, data[base_arm.name], data[arms[2].name], ref_engine, edges, topk)
        floor.pop("topk_shared_mean", None)
        ratio = {b: _ratio(v["kl_mean"], (floor["buckets"].get(b) or {}).get("kl_mean"))
                 for b, v in result["buckets"].items()}
        result["noise_floor"] = {**control_info, "arm": arms[2].name,
                                 "kl": "KL(baseline || control) in nats, mean over positions", **floor,
                                 "kl_ratio": {"buckets": ratio, "overall": _ratio(result["overall"]["kl_mean"],
                                                                                  floor["overall"]["kl_mean"])}}
    if text_counts is not None:
        result["texts"] = {"files": [str(t) for t in dcfg.texts], **text_counts}
    result["elapsed_s"] = round(time.perf_counter() - t0, 2)
    (run_dir / "divergence.json").write_text(json.dumps(redact_obj(result), indent=2) + "\n", encoding="utf-8")
    if dcfg.plot:
        try:
            from fp8eval.divergence.plot import plot_divergence

            plot_divergence(result, run_dir / "divergence.png")
        except ImportError as e:  # matplotlib is the `report` extra
            print(f"divergence: no plot ({e}); pip install matplotlib", file=sys.stderr)
    return result


def format_table(result: dict) -> str:
    """The per-bucket table printed at the end of a run (with the control's KL, the noise floor, beside it)."""
    floor = result.get("noise_floor")
    head = f"{result['model']} {result['engine']}: {result['kv']} vs {result['baseline']} ({result['method']})"
    cols = f"{'bucket':>10} {'n':>7} {'KL':>10} {'top1':>7} {'|dlogp|':>9}"
    lines = [head, cols + (f" {'KL floor':>10} {'top1 fl':>7} {'KL/floor':>9}" if floor else "")]
    fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    for label, b in [*result["buckets"].items(), ("overall", result["overall"])]:
        line = (f"{label:>10} {b['n_tokens']:>7} {fmt(b['kl_mean'], '.3e'):>10} {fmt(b['top1_agree'], '.3f'):>7} "
                f"{fmt(b['dlogp_mean'], '.3e'):>9}")
        if floor:
            f = floor["overall"] if label == "overall" else floor["buckets"].get(label) or {}
            r = floor["kl_ratio"]["overall"] if label == "overall" else floor["kl_ratio"]["buckets"].get(label)
            line += f" {fmt(f.get('kl_mean'), '.3e'):>10} {fmt(f.get('top1_agree'), '.3f'):>7} {fmt(r, '.2f'):>9}"
        lines.append(line)
    if floor:
        lines.append(f"noise floor: {floor['arm']} ({floor.get('description') or floor['name']}) vs {result['baseline']}"
                     + ("; INERT on this engine" if floor.get("inert") else ""))
        lines += [f"  {r['knob']}={r['value']}: no effect here ({r['why']})" for r in floor["knobs"] if not r["effective"]]
    return "\n".join(lines)
