"""The pareto sweep: plan the points (format x skip list x calibration), check each for feasibility, run the
divergence probe on the feasible ones (cheap, first), optionally task recovery and perf on the survivors, then
the frontier, the pick and its serve line. Writes pareto.json (+ pareto.png).

Resumable and fingerprinted: every arm's per-passage result is kept by the divergence probe under
`<records_dir>/divergence/<arm fingerprint>` (a rerun loads what exists), and each point's summary is written to
`<run dir>/points/<key>.json` as soon as it is measured; pareto.json carries the fingerprint of the sweep's
settings.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from fp8eval.arms import arm_spec, baseline_arm, compose_kv, open_engines
from fp8eval.core.hashing import fingerprint_hash
from fp8eval.core.kvformats import FORMATS, effective_skip_layers
from fp8eval.core.secrets import redact_obj
from fp8eval.divergence import run as divergence_run
from fp8eval.engines import resolve_kind, with_prefill_chunk
from fp8eval.engines.base import EngineError
from fp8eval.feasibility import check_many, layout_from_config, rule_check
from fp8eval.pareto import frontier as F
from fp8eval.pareto import steps
from fp8eval.pareto.config import validate
from fp8eval.pareto.measure import Probe

SCHEMA = 1


def _model_config(cfg) -> dict:
    from fp8eval.models import local_model_dir

    return json.loads((Path(local_model_dir(cfg.model)) / "config.json").read_text(encoding="utf-8"))


def _passages(cfg, out) -> list:
    """The divergence probe's passages: the shipped books (divergence.documents per length) and the user's texts."""
    from fp8eval.divergence.documents import load_tokenizer, passages, read_texts, text_passages

    d = cfg.divergence
    limit = int(cfg.model.max_model_len) - 1
    lengths = [int(n) for n in d.lengths if int(n) <= limit]
    if len(lengths) < len(d.lengths):
        out(f"pareto: skipped lengths above model.max_model_len - 1 = {limit}: "
            f"{[n for n in d.lengths if int(n) > limit]}")
    tok = load_tokenizer(cfg.model)
    docs = passages(tok, lengths, int(d.documents)) if int(d.documents) > 0 else []
    if d.texts:
        own, counts = text_passages(tok, read_texts(list(d.texts)), lengths)
        out(f"pareto: divergence.texts: {counts}")
        docs += own
    if not docs:
        raise ValueError("pareto: no passage to measure (divergence.documents=0 and no divergence.texts)")
    return docs


def plan(cfg) -> list[dict]:
    """The points to measure: one per (format, skip list, calibration), calibration only for per-tensor FP8."""
    p = cfg.pareto
    skips = [list(s) for s in p.skip_lists]
    if p.sensitivity:
        rec = json.loads(Path(p.sensitivity).read_text(encoding="utf-8")).get("recommended_skip_layers") or []
        skips.append([str(i) for i in rec])
    seen, out = set(), []
    for fmt in p.formats:
        kv = compose_kv(fmt, cfg.model.name)
        dtype = str(kv.engine_args.get("kv_cache_dtype", "auto"))
        family = FORMATS[dtype].family if dtype in FORMATS else "other"
        calibs = list(p.calibrations) if family == "fp8_tensor" else [None]
        for skip in skips:
            for calib in calibs:
                skip_s = sorted({str(s) for s in skip}, key=lambda x: (not x.isdigit(), int(x) if x.isdigit() else 0, x))
                key = f"{fmt}|skip={','.join(skip_s) or '-'}|scales={Path(calib).name if calib else '-'}"
                if key in seen:
                    continue
                seen.add(key)
                out.append({"key": key, "kv": fmt, "cache_dtype": dtype, "family": family, "skip": skip_s,
                            "scales": calib})
    return out


def _point_kv(cfg, point: dict):
    kv = compose_kv(point["kv"], cfg.model.name)
    args = dict(kv.engine_args)
    if point["skip"]:
        args["kv_cache_dtype_skip_layers"] = list(point["skip"])
    name = point["kv"] + (f"+skip{'_'.join(point['skip'])}" if point["skip"] else "")
    scales = point["scales"] if point["scales"] else kv.scales
    return dataclasses.replace(kv, name=name, engine_args=args, scales=scales)


def run(cfg, run_dir: Path, out=print) -> dict:
    """The whole sweep; returns and writes pareto.json."""
    t0 = time.perf_counter()
    p = cfg.pareto
    problems = validate(p)
    if problems:
        raise ValueError("; ".join(problems))
    run_dir = Path(run_dir)
    (run_dir / "points").mkdir(parents=True, exist_ok=True)
    layout = layout_from_config(_model_config(cfg))
    points = plan(cfg)
    settings = {"model": dataclasses.asdict(cfg.model), "engine": dataclasses.asdict(cfg.engine),
                "baseline": cfg.baseline, "divergence": _divergence_settings(cfg.divergence),
                "pareto": dataclasses.asdict(p), "schema": SCHEMA}
    fp = fingerprint_hash(settings)
    # Feasibility first: nothing vLLM cannot serve is measured or recommended.
    python = None
    if p.feasibility in ("auto", "oracle"):
        from fp8eval.engines.vllm.args import vllm_python

        python = vllm_python()
    cases = [(pt["cache_dtype"], pt["skip"]) for pt in points]
    if p.feasibility == "off":
        verdicts = [None] * len(points)
    elif p.feasibility == "rule":
        verdicts = [rule_check(layout, c, s) for c, s in cases]
    else:
        verdicts = check_many(layout, cases, python)
    for pt, v in zip(points, verdicts):
        pt["feasible"] = True if v is None else v.feasible
        pt["feasibility"] = v.as_dict() if v is not None else {"how": "off"}
        pt["effective_skip"] = effective_skip_layers(pt["cache_dtype"], pt["skip"], len(layout.types))
        pt["kv_bytes_per_token"] = F.kv_bytes_per_token(layout, pt["cache_dtype"], pt["skip"])
        fmt = FORMATS.get(pt["cache_dtype"])
        pt["needs"] = fmt.needs if fmt else None
    # The same cache twice (a skip list that only names layers the format keeps in BF16 anyway) is measured once.
    same: dict[tuple, str] = {}
    for pt in points:
        ident = (pt["kv"], tuple(pt["effective_skip"]), pt["scales"])
        if ident in same:
            pt["feasible"], pt["same_as"] = False, same[ident]
            pt["feasibility"] = {"how": "dedup", "reason": f"the same cache as {same[ident]}"}
        else:
            same[ident] = pt["key"]
    bf16_bytes = F.kv_bytes_per_token(layout, "bfloat16", [])
    infeasible = [pt["key"] for pt in points if not pt["feasible"] and not pt.get("same_as")]
    out(f"pareto: {len(points)} point(s), {len(infeasible)} infeasible (not run): {infeasible or '-'}")
    engine = with_prefill_chunk(cfg, p.prefill_chunk)  # the way the engine kind chunks a prefill
    probe_cfg = divergence_run.engine_cfg(dataclasses.replace(cfg, engine=engine))
    records = Path(cfg.records_dir).expanduser()
    records = records if records.is_absolute() else Path.cwd() / records
    with open_engines(probe_cfg) as door:
        probe = Probe(probe_cfg, door, _passages(cfg, out), records, out)
        errors = _measure_points(cfg, probe_cfg, probe, points, bf16_bytes, run_dir, out)
    result = _finish(cfg, run_dir, points, layout, probe, bf16_bytes, fp, infeasible, errors, t0, out)
    return result


def _measure_points(cfg, probe_cfg, probe, points, bf16_bytes, run_dir: Path, out) -> dict:
    """The divergence probe on every feasible point not measured yet (each saved under <run dir>/points)."""
    base_arm = baseline_arm(probe_cfg)
    errors: dict = {}
    _partial(run_dir, cfg, points, probe, errors)
    for pt in points:
        pt["capacity_vs_bf16"] = bf16_bytes / pt["kv_bytes_per_token"]
        if not pt["feasible"]:
            continue
        saved = run_dir / "points" / f"{_point_fingerprint(probe_cfg, pt['key'], probe.docs)[:16]}.json"
        if saved.exists():
            pt.update(json.loads(saved.read_text(encoding="utf-8")))
            continue
        try:
            base = probe.baseline(base_arm)
            data, info = probe.arm(arm_spec(probe_cfg, _point_kv(cfg, pt), "variant"))
            res = probe.compare(base, data)
        except (EngineError, ValueError) as e:
            errors[pt["key"]] = f"{type(e).__name__}: {e}"
            pt["error"] = errors[pt["key"]][:600]
            out(f"pareto: {pt['key']}: {pt['error']}")
            continue
        got = {"kl": res["overall"]["kl_mean"], "top1_agree": res["overall"]["top1_agree"],
               "kl_buckets": {b: v["kl_mean"] for b, v in res["buckets"].items()}, "method": res["method"],
               "kl_topk_view": (res.get("topk_view") or {}).get("overall", {}).get("kl_mean"),
               "kl_topk_view_buckets": {b: v["kl_mean"] for b, v in (res.get("topk_view") or {}).get("buckets",
                                                                                                     {}).items()},
               **info}
        pt.update(got)
        saved.write_text(json.dumps(got, indent=2) + "\n", encoding="utf-8")
        out(f"pareto: {pt['key']}: KL {got['kl']:.3e}, {pt['kv_bytes_per_token']} B/token")
        _partial(run_dir, cfg, points, probe, errors)
    return errors


def _point_fingerprint(probe_cfg, key: str, docs) -> str:
    """What a saved point's result depends on: the model, the engine settings (prefill chunk included), the
    baseline, the divergence settings, the passages' content and the point itself (not the other points, the
    targets or the plot)."""
    return fingerprint_hash({"schema": SCHEMA, "key": key, "passages": [d.key for d in docs],
                             "model": dataclasses.asdict(probe_cfg.model),
                             "engine": dataclasses.asdict(probe_cfg.engine), "baseline": probe_cfg.baseline,
                             "divergence": _divergence_settings(probe_cfg.divergence)})


def _divergence_settings(d) -> dict:
    """The divergence settings a sweep's fingerprints see: `path` only when it is not prefill, so sweeps made before
    the decode path existed (all prefill) keep theirs."""
    out = dataclasses.asdict(d)
    if out.get("path") == "prefill":
        out.pop("path")
    return out


def _partial(run_dir: Path, cfg, points, probe, errors) -> None:
    """pareto.json while the sweep runs (complete: false): a sweep cut short still shows what it measured."""
    (run_dir / "pareto.json").write_text(json.dumps(redact_obj({
        "schema": SCHEMA, "complete": False, "model": cfg.model.name, "engine": resolve_kind(cfg),
        "baseline": cfg.baseline, "baseline_info": getattr(probe, "base_info", None), "points": points,
        "errors": errors, "frontier": [], "pick": None}), indent=2) + "\n", encoding="utf-8")


def _finish(cfg, run_dir: Path, points, layout, probe, bf16_bytes, fp, infeasible, errors, t0, out) -> dict:
    """Survivors' optional steps, the frontier, the pick and its serve line; writes pareto.json (+ plot)."""
    p = cfg.pareto
    measured = [pt for pt in points if pt.get("kl") is not None]
    survivors = sorted(measured, key=lambda q: q["kl"])[:p.survivors]
    if p.max_kl is not None:
        survivors = [q for q in survivors if q["kl"] <= p.max_kl] or survivors[:1]
    if p.task:
        for pt in survivors:
            pt["recovery"] = steps.task_recovery(cfg, pt, run_dir, out)
    if p.perf:
        for pt in survivors:
            pt["perf"] = steps.perf(cfg, pt, run_dir, out)
    front = F.frontier(measured)
    for pt in points:
        pt["on_frontier"] = pt["key"] in front
    pickable = [pt for pt in points if not (p.exclude_needs and pt.get("needs"))]
    best, why = F.pick(pickable, p.max_kl, p.min_recovery)
    result = {
        "schema": SCHEMA, "complete": True, "fingerprint": fp, "model": cfg.model.name, "engine": resolve_kind(cfg),
        "baseline": cfg.baseline, "baseline_info": getattr(probe, "base_info", None),
        "passages": [{"book": d.book, "length": d.length, "key": d.key} for d in probe.docs], "layout": {"types": list(layout.types), "n_kv_heads": layout.n_kv_heads,
                                             "head_dim": layout.head_dim},
        "bf16_kv_bytes_per_token": bf16_bytes, "prefill_chunk": p.prefill_chunk,
        "target": {"max_kl": p.max_kl, "min_recovery": p.min_recovery},
        "points": points, "frontier": front, "survivors": [q["key"] for q in survivors],
        "counts": {"planned": len(points), "infeasible": len(infeasible), "measured": len(measured),
                   "errors": len(errors)},
        "errors": errors, "pick": best["key"] if best else None, "pick_reason": why,
        "pick_excludes": sorted({pt["cache_dtype"] for pt in points if pt not in pickable}),
        "serve": None, "elapsed_s": round(time.perf_counter() - t0, 1),
    }
    if best is not None:
        kv = _point_kv(cfg, best)
        model = p.serve_model or cfg.model.hf_id
        extra = {"max_model_len": int(cfg.model.max_model_len)}
        fmt = FORMATS.get(best["cache_dtype"])
        if fmt and fmt.family in ("per_token_head", "turboquant"):
            extra["attention_backend"] = fmt.backend
        serve_args = {k: v for k, v in kv.engine_args.items() if k in ("kv_cache_dtype", "kv_cache_dtype_skip_layers",
                                                                        "dtype")}
        result["serve"] = F.serve_line(model, serve_args, extra)
        if kv.scales:
            result["serve_note"] = (f"calibrated scales: serve the checkpoint {kv.scales} (it carries k_scale / "
                                    f"v_scale) in place of {model}")
    (run_dir / "pareto.json").write_text(json.dumps(redact_obj(result), indent=2) + "\n", encoding="utf-8")
    if p.plot:
        try:
            from fp8eval.pareto.plot import plot_pareto

            plot_pareto(result, run_dir / "pareto.png")
            result["plot"] = str(run_dir / "pareto.png")
        except ImportError as e:
            out(f"pareto: no plot ({e}); pip install matplotlib")
    return result
