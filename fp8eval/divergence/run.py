"""One divergence run: both arms read the same passages on the kernel path(s) `divergence.path` names (decode steps,
one prefill, or both and the path gap: fp8eval.divergence.paths), the measures per position bucket, divergence.json.

Resumable and fingerprinted like the runner's arms: each (arm, passage) result is kept under
`<records_dir>/divergence/<fingerprint[:20]>/<passage key>.npz`, the fingerprint covering the model, the
engine's describe() (versions, kv settings, preflight), the kv config and what was kept (hidden states or
top-k); a rerun loads what exists and computes only what is missing.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np

import fp8eval.control as controls
from fp8eval.arms import ArmEngines, arm_material, kv_view, open_engines, resolve_arms
from fp8eval.core.hashing import canonical_json, fingerprint_hash
from fp8eval.core.secrets import redact_obj
from fp8eval.divergence import continuation as C
from fp8eval.divergence import measures as M
from fp8eval.divergence import paths as P
from fp8eval.divergence import sources
from fp8eval.divergence.documents import Passage, load_tokenizer, passages, read_texts, text_passages
from fp8eval.engines import capabilities, resolve_kind, with_topk

SCHEMA = 1
TOPK_NOTE = ("KL over the tokens in both arms' top-k prompt_logprobs, both distributions renormalised to that "
             "shared set: it ignores the probability mass outside it, so it reads low (on the reference engine the "
             "full-vocabulary KL was 12-22 % above it for a K/V-only FP8 cache, issue 18). top1_agree compares the "
             "two arms' most likely tokens; dlogp_mean is over positions whose BF16 argmax is in the variant's top-k.")
EXACT_NOTE = "KL over the full vocabulary from both arms' logits (exact)."
# The knobs that only shape a prefill: inert on the decode path alone.
CHUNK_KNOBS = ("engine.prefill_chunk", "engine_args.max_num_batched_tokens", "engine_args.enable_chunked_prefill")


def arm_fingerprint(cfg, engine, kv, kind: str, control=None, path: str = "prefill") -> tuple[str, dict]:
    """sha256 over everything that can change an arm's per-passage result (`kv`: a KVConfig or an ArmSpec;
    `control`: the control config of a control arm, None otherwise; `path`: the kernel path, which enters only when
    decode, so prefill results keep their fingerprints), and its material (fp8eval.arms.arm_material)."""
    kv_d = kv_view(kv)
    kept: object = kind if kind == "hidden" else {"topk": int(cfg.divergence.topk)}
    if kind != "hidden" and int(getattr(cfg.divergence, "batch", 1)) != 1:  # only then: older results keep theirs
        kept = {**kept, "batch": int(cfg.divergence.batch)}
    desc = engine.describe()
    forcing = getattr(getattr(engine, "capabilities", None), "decode_logits_processor", "")  # (stand-ins have none)
    if path == "decode":
        # (the reference engine's decode path in one pass: other float32 orders than its earlier step loop)
        kept = {"kept": kept, "path": "decode", "decode": "one_pass"} if kind == "hidden" else {**kept, "path": "decode"}
        if kind == "hidden" and int(getattr(cfg.divergence, "batch", 1)) != 1:  # the emulated split count follows it
            kept = {**kept, "batch": int(cfg.divergence.batch)}
    elif forcing and forcing in ((desc.get("engine_args") or {}).get("logits_processors") or []):
        # the forcing processor (and the synchronous scheduling it asks for) changes nothing a prefill computes: such
        # results are shared with prefill-only runs
        args = {k: v for k, v in desc["engine_args"].items() if k not in ("logits_processors", "async_scheduling")}
        rest = [x for x in desc["engine_args"]["logits_processors"] if x != forcing]
        desc = {**desc, "engine_args": {**args, **({"logits_processors": rest} if rest else {})}}
    material = arm_material(cfg, kv, desc, {"divergence_schema": SCHEMA, "kept": kept}, kv_d=kv_d,
                            dtype=(kv_d.get("engine_args") or {}).get("dtype"), control=control)
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


def engine_cfg(cfg):
    """The run config with room for `divergence.topk` log-probs per position where the engine caps them (vLLM's
    max_logprobs, 20 by default: fp8eval.engines.with_topk), and, for the decode path, the logits processor the engine
    forces a passage with (its capabilities' decode_logits_processor) among the engine args it starts with."""
    cfg = with_topk(cfg, int(cfg.divergence.topk))
    forcing = capabilities(cfg).decode_logits_processor
    if forcing and "decode" in P.paths_of(str(getattr(cfg.divergence, "path", "prefill"))):
        args = dict(cfg.engine.engine_args)
        procs = [str(x) for x in (args.get("logits_processors") or [])]
        args["logits_processors"] = procs if forcing in procs else [*procs, forcing]
        # The processor reads each step from the request's output ids, which asynchronous scheduling hands over one
        # step late (the forcing then breaks, H200, vLLM 0.26.0): off unless the user says otherwise.
        args.setdefault("async_scheduling", False)
        cfg.engine.engine_args = args
    return cfg


def _topk_measures(base_ids, base_lp, var_ids, var_lp):
    args = (base_ids, base_lp, var_ids, var_lp)
    kl, n_shared = M.kl_from_topk(*args)
    return kl, M.top1_from_topk(*args), M.dlogp_from_topk(*args), n_shared


def position_measures(base: dict, var: dict, probe, n_pos: int, topk: int):
    """Per-position (kl, top1, dlogp, n_shared or None) over positions 0..n_pos-1; for hidden states (`probe`: the
    engine's probe that made them, `engine.probe()`) also the same measures from each arm's top-k only (what
    vLLM's prompt_logprobs would have given), so an emulation can be set against the real kernel on the same
    footing."""
    if "hidden" not in base:
        n = n_pos
        return _topk_measures(base["ids"][:n], base["logprobs"][:n], var["ids"][:n], var["logprobs"][:n]), None
    import torch

    step = max(16, (1 << 24) // probe.vocab_size)  # ~16M logits a slice per arm
    exact, approx = [], []
    for s in range(0, n_pos, step):
        lb = probe.logits(base["hidden"][s:min(s + step, n_pos)])
        lv = probe.logits(var["hidden"][s:min(s + step, n_pos)])
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
    arms = resolve_arms(cfg, control=True)
    if len(arms) == 1:
        arms = [arms[0], arms[0]]  # the variant compared with itself (KL 0): one arm computed once

    decode_only = P.paths_of(str(cfg.divergence.path)) == ["decode"]

    def prefill_only(effects: list[dict]) -> None:  # this wing's own knob rules
        for r in effects:  # a batch cap matters only when passages go to the engine together
            if decode_only and r["knob"] in CHUNK_KNOBS:
                r.update(effective=False, why="divergence.path=decode: one token is prefilled, the rest are decode steps")
            if r["knob"] == "engine_args.max_num_seqs" and int(cfg.divergence.batch) <= 1:
                r.update(effective=False, why="passages are prefilled one at a time (divergence.batch=1)")
            if r["knob"] == "seed_offset":
                r.update(effective=False, why="nothing is sampled (prefill, or decode steps forced to the passage)")

    return arms, controls.preflight(cfg, arms, {"temperature": 0.0}, 1, prefill_only, out)


def _compute_arm(cfg, engine, arm, docs, records: Path, out, path: str = "prefill") -> tuple[dict, dict, str]:
    """Every passage through one arm on one kernel path, from its cache where kept: ({passage key: result}, arm info,
    kind). With divergence.path=both, a top-k result kept without the tokens' own log-probs is computed again."""
    kind = sources.source_kind(engine)
    control = controls.control_of(cfg) if arm.role == controls.ROLE else None
    fp, material = arm_fingerprint(cfg, engine, arm, kind, control, path)
    cache = ArmCache(records, fp, material)
    got = {p.key: cache.load(p) for p in docs}
    need_own = kind == "topk" and str(cfg.divergence.path) == "both"  # the path gap reads each token's own log-prob
    todo = [p for p in docs if got[p.key] is None or (need_own and "token_logprobs" not in got[p.key])]
    missing = {p.key for p in todo}
    batch = max(1, int(cfg.divergence.batch)) if kind == "topk" or path == "decode" else 1
    for part in passage_batches(docs, batch):
        if not any(p.key in missing for p in part):
            continue
        t = time.perf_counter()
        if kind == "hidden":  # one passage at a time, each decoded as in its batch
            lengths = [p.length for p in part] if path == "decode" and batch > 1 else None
            part = [p for p in part if p.key in missing]
            results = [sources.compute(engine, p.ids, int(cfg.divergence.topk), path, lengths) for p in part]
        else:  # the whole batch again, so that every result of it was computed in the same company
            rows = sources.topk_rows(engine, path)([list(p.ids) for p in part], int(cfg.divergence.topk))
            results = [sources.topk_result(r) for r in rows]
        for p, r in zip(part, results):
            cache.save(p, r)
            got[p.key] = r
        out(f"{arm.name} ({path}): {len(part)} passage(s), {sum(p.length for p in part)} tokens in "
            f"{time.perf_counter() - t:.1f} s")
    info = {"fingerprint": fp, "cache": str(cache.dir), "passages_computed": len(todo),
            "passages_reused": len(docs) - len(todo), "path": path}
    if engine.preflight is not None:
        info["preflight"] = engine.preflight
    return got, info, kind


def passage_batches(docs, batch: int) -> list[list]:
    """The passages in the groups sent to an engine together: each length's passages (in order) in runs of `batch`.
    Fixed by the passages alone, so a resumed run computes a passage in the same company as the first try did (on the
    decode path, equal lengths keep a batch in step: FA3's split count depends on the batch)."""
    by_length: dict[int, list] = {}
    for p in docs:
        by_length.setdefault(p.length, []).append(p)
    return [group[i:i + batch] for group in by_length.values() for i in range(0, len(group), batch)]


def _compare(docs, base: dict, var: dict, probe, edges, topk: int) -> dict:
    """The measures of one arm against the baseline over every passage: buckets, overall, by length, top-k view."""
    overall, by_length, topk_view = M.BucketAccumulator(edges=edges), {}, M.BucketAccumulator(edges=edges)
    shared_counts = []
    for p in docs:
        n_pos = p.length - 1  # the distribution after the last token predicts nothing in the passage
        main, approx = position_measures(base[p.key], var[p.key], probe, n_pos, topk)
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
    """Every passage through the variant, the baseline (and a control) arm on the kernel path(s) divergence.path names,
    compare, write divergence.json."""
    from fp8eval.validate import validate_config

    validate_config(cfg)  # before any engine is opened (pareto and sensitivity call run() too)
    P.paths_of(str(cfg.divergence.path))  # an unknown path fails here, before any engine is opened
    with open_engines(cfg) as door:  # the reference engine's model stays loaded for the measures
        return _run(cfg, run_dir, door, out)


def _run(cfg, run_dir: Path, door: ArmEngines, out) -> dict:
    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    dcfg = cfg.divergence
    cfg = engine_cfg(cfg)
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
    C.check(cfg, [p.length for p in docs])
    greedy = str(dcfg.continuation) == "greedy"
    continued = None
    paths, first = P.paths_of(str(dcfg.path)), P.primary(str(dcfg.path))
    data: dict[str, dict[str, dict[str, dict]]] = {p: {} for p in paths}
    arm_info: dict[str, dict] = {}
    ref_engine = None
    kind = None
    order = {base_arm.name: -1 if greedy else 1}
    order.update({a.name: 2 for a in arms if a.role == controls.ROLE})
    # the variant first: a configuration the engine cannot serve fails early (the baseline first when its greedy
    # continuation is the text both arms read); each distinct arm once
    for arm in sorted({a.name: a for a in arms}.values(), key=lambda a: order.get(a.name, 0)):
        engine = door.open(arm)
        kind = None
        try:
            if greedy and arm.name == base_arm.name:
                fp = arm_fingerprint(cfg, engine, arm, sources.source_kind(engine), None, "decode")[0]
                docs, continued = C.greedy_passages(cfg, engine, docs, passage_batches(docs, max(1, int(dcfg.batch))),
                                                    records / "divergence" / "greedy" / fp[:20], out)
            infos = {}
            for path in paths:
                data[path][arm.name], infos[path], kind = _compute_arm(cfg, engine, arm, docs, records, out, path)
            arm_info[arm.name] = infos[first]
            if len(paths) == 2:
                arm_info[arm.name]["other_path"] = infos["prefill"]
        finally:
            if kind == "hidden":
                ref_engine = engine  # keeps the shared model for lm_head (closed with the door)
            else:
                door.close(engine)
    edges = tuple(int(e) for e in dcfg.edges)
    topk = int(dcfg.topk)
    probe_of = ref_engine.probe() if ref_engine is not None else contextlib.nullcontext()
    with probe_of as probe:  # the engine that made hidden states turns them into logits
        main = _compare(docs, data[first][base_arm.name], data[first][var_arm.name], probe, edges, topk)
        floor = (_compare(docs, data[first][base_arm.name], data[first][arms[2].name], probe, edges, topk)
                 if control_info is not None else None)
        if len(paths) == 2:  # both paths' KL per bucket, and each arm's path gap (the BF16 arm's is the floor)
            other = _compare(docs, data["prefill"][base_arm.name], data["prefill"][var_arm.name], probe, edges, topk)
            gaps = {name: P.path_gap(docs, data["prefill"][name], data["decode"][name], probe, edges)
                    for name in dict.fromkeys(a.name for a in arms)}
    result = {
        "model": cfg.model.name, "kv": var_arm.name, "baseline": base_arm.name, "engine": resolve_kind(cfg),
        "path": str(dcfg.path), "kernel_path": first,
        "method": "exact_full_vocabulary" if kind == "hidden" else "topk_shared_renormalised",
        "topk": None if kind == "hidden" else topk,
        "approximation": EXACT_NOTE if kind == "hidden" else TOPK_NOTE,
        "kl": "KL(baseline || variant) in nats, mean over positions",
        "buckets": main["buckets"], "overall": main["overall"], "by_length": main["by_length"],
        "edges": list(edges),
        "passages": [{"length": p.length, "index": p.index, "book": p.book, "char_offset": p.char_offset,
                      "key": p.key} for p in docs],
        "arms": arm_info,
        "continuation": continued or {"kind": "text"},
        "elapsed_s": None,
    }
    for key in ("topk_shared_mean", "topk_view"):
        if key in main:
            result[key] = main[key]
    if len(paths) == 2:
        keep = ("buckets", "overall", "by_length", "topk_view")
        result["paths"] = {first: {k: main[k] for k in keep if k in main}, "prefill": {k: other[k] for k in keep if k in other}}
        result["path_gap"] = gaps
    if control_info is not None:  # the noise floor: the control arm against the same baseline
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
    head = (f"{result['model']} {result['engine']}: {result['kv']} vs {result['baseline']} ({result['method']}, "
            f"{result.get('kernel_path', 'prefill')} path)")
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
    if "paths" in result:
        pre = result["paths"]["prefill"]
        lines.append("prefill path (the table above is the decode path):")
        lines += [f"{label:>10} {b['n_tokens']:>7} {fmt(b['kl_mean'], '.3e'):>10} {fmt(b['top1_agree'], '.3f'):>7} "
                  f"{fmt(b['dlogp_mean'], '.3e'):>9}" for label, b in [*pre["buckets"].items(), ("overall", pre["overall"])]]
    return "\n".join(lines + P.format_gaps(result))
