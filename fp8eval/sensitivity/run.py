"""The sensitivity flow: K/V statistics, 2 x layers + 2 passes per passage (document and length), ranking, the
recommended skip list re-measured (and grown while it falls short of the target, `sensitivity.refine`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fp8eval.arms import ArmEngines, open_engines, resolve_arms
from fp8eval.divergence import measures as M
from fp8eval.engines import resolve_kind
from fp8eval.sensitivity import ranking
from fp8eval.sensitivity.cache import PassageCache, skip_key
from fp8eval.sensitivity.cache import fingerprint as cache_fingerprint
from fp8eval.sensitivity.config import SensitivityRunConfig, validate
from fp8eval.sensitivity.feasible import Feasibility
from fp8eval.sensitivity.kvstats import KVStatsAccumulator, recording_policy
from fp8eval.sensitivity.passes import Baseline, Passes, SensitivityError, measure, replay, slice_step


@dataclass
class Cost:
    n_layers: int
    n_units: int
    hybrid: bool
    refine: int
    path: str = "prefill"  # the kernel path each pass reads (sensitivity.path)

    @property
    def per_unit(self) -> int:
        """BF16 + full FP8 + per layer (only this, all but this) [+ sliding-window layers in BF16]."""
        return 2 * self.n_layers + 2 + (1 if self.hybrid else 0)

    @property
    def total(self) -> int:
        """Prefill passes of the run without refinement: per passage, per_unit plus one to re-measure the recommended
        skip list."""
        return self.n_units * (self.per_unit + 1)

    def line(self, lengths: list[int], documents: int) -> str:
        """One line that tells the user what the run costs: passes per passage, passages and the total."""
        return (f"sensitivity: {self.n_layers} layers -> forward passes = 2 x {self.n_layers} + 2 = "
                f"{2 * self.n_layers + 2}{' + 1 (sliding-window layers in BF16)' if self.hybrid else ''} per "
                f"document and length, + 1 to re-measure the recommended skip list (+ up to {self.refine} more "
                f"if it falls short of the target); {documents} document(s) x lengths {sorted(set(lengths))} = "
                f"{self.n_units} passage(s): {self.total} passes on the {self.path} path"
                f"{f' (up to {self.total + self.refine * self.n_units})' if self.refine else ''}")


def run(cfg: SensitivityRunConfig, log: Callable[[str], None] = print) -> dict:
    """Measure everything and return the sensitivity.json content (written by `outputs`); the arms and their
    engines come through `fp8eval.arms` (the baseline composed by Hydra like the variant)."""
    with open_engines(cfg) as door:
        return _run(cfg, door, log)


def _run(cfg: SensitivityRunConfig, door: ArmEngines, log: Callable[[str], None]) -> dict:
    s = cfg.sensitivity
    problems = validate(s)
    if problems:
        raise SensitivityError("; ".join(problems))
    too_long = [n for n in s.lengths if n > int(cfg.model.max_model_len)]
    if too_long:
        raise SensitivityError(f"sensitivity.lengths {too_long} exceed model.max_model_len={cfg.model.max_model_len}")
    edges = tuple(s.edges)
    arms = resolve_arms(cfg)
    if arms[0].role == "single":
        raise SensitivityError("sensitivity compares every layer with a BF16 baseline arm: baseline=none has none; "
                               "use baseline=bf16")
    passes = Passes(cfg, door, arms)
    if passes.ignored_skip:
        log(f"sensitivity: kv={cfg.kv.name} skips {passes.ignored_skip}; every layer is measured, so that list "
            f"is ignored here (the recommendation replaces it)")
    docs = passes.passages(s.documents, list(s.lengths))
    L = passes.n_layers
    sliding = [i for i, t in enumerate(passes.types) if "sliding" in t]
    hybrid = 0 < len(sliding) < L
    cost = Cost(L, len(docs), hybrid, s.refine, str(getattr(s, "path", "prefill")))
    log(cost.line(list(s.lengths), s.documents))
    passes.check_head(docs[0].ids)
    fp, material = cache_fingerprint(cfg, passes.engine.describe(), arms[-1].kv, arms[0].kv)
    cache = PassageCache(_records_root(cfg), fp, material)

    stats = KVStatsAccumulator(fmt=passes.arm.fmt)
    configs = [("full", passes.fp8_policy([]))]
    configs += [(f"only:{i}", passes.only(i)) for i in range(L)]
    configs += [(f"all_but:{i}", passes.fp8_policy([i])) for i in range(L)]
    if hybrid:
        configs.append(("skip_sliding", passes.fp8_policy(["sliding_window"])))
    results = {name: M.BucketAccumulator(edges) for name, _ in configs}
    step = slice_step(passes.vocab)
    kept: list[list] = []  # [passage, its stored arrays, its Baseline (None until needed)]
    per_passage: list[dict] = []
    reused = 0
    bar = _bar(cost.total, s.progress)
    for doc in docs:
        bar.set_description(f"{doc.book.removesuffix('.txt')}@{doc.length}")
        got, base = cache.load(doc), None
        if not all(f"{name}:kl" in got for name, _ in configs):
            got, doc_stats = {}, KVStatsAccumulator(fmt=passes.arm.fmt)
            base = Baseline(passes, passes.hidden(recording_policy(passes.bf16, passes.arm, doc_stats), doc.ids),
                            s.cache_logits_gib)
            bar.update()
            for name, pol in configs:
                got.update(_named(name, measure(passes, base, passes.hidden(pol, doc.ids))))
                bar.update()
            got.update(doc_stats.to_arrays())
            cache.save(doc, got)
            base.release()  # only the hidden states stay, for the re-measurement
        else:
            reused += 1
            bar.update(1 + len(configs))
        stats.merge(KVStatsAccumulator.from_arrays(got, passes.arm.fmt))
        for name, _ in configs:
            into = [results[name]] + ([M.BucketAccumulator(edges)] if name == "full" else [])
            replay(_measured(name, got), step, *into)
            if name == "full":
                per_passage.append({"book": doc.book, "length": doc.length, **into[1].overall()})
        kept.append([doc, got, base])

    overall = {name: acc.overall() for name, acc in results.items()}
    kl_full = overall["full"]["kl_mean"]
    only = {i: overall[f"only:{i}"]["kl_mean"] for i in range(L)}
    all_but = {i: overall[f"all_but:{i}"]["kl_mean"] for i in range(L)}
    scores = ranking.layer_scores(kl_full, only, all_but, s.rank_by)
    order = ranking.rank(scores, tiebreak=only)
    chosen = ranking.smallest_skip_set(order, scores, s.target)
    values = {i: stats.kv_values_per_token(i) for i in range(L)}
    feas = Feasibility(cfg, passes, s.feasibility)
    ranked_choice = list(chosen)
    chosen = feas.best(order, scores, s.target, values, chosen, log)

    def measure_skip(skip: list[int]) -> M.BucketAccumulator:
        acc, name = M.BucketAccumulator(edges), f"skip[{skip_key(skip)}]"
        for entry in kept:
            doc, got, base = entry
            if f"{name}:kl" not in got:
                if base is None:  # a resumed passage: its BF16 hidden states again (one more prefill)
                    base = entry[2] = Baseline(passes, passes.hidden(passes.bf16, doc.ids), s.cache_logits_gib)
                got.update(_named(name, measure(passes, base, passes.hidden(passes.fp8_policy(skip), doc.ids))))
                cache.save(doc, got)
            replay(_measured(name, got), step, acc)
            bar.update()
        return acc

    with_skip = measure_skip(chosen)
    steps = [{"skip": list(chosen), "kl": with_skip.overall()["kl_mean"]}]
    extra = [i for i in order if i not in chosen]
    while _removed(kl_full, steps[-1]["kl"]) < s.target and extra and len(steps) <= s.refine:
        nxt = extra.pop(0)
        if not feas.ok(sorted([*chosen, nxt])):
            continue  # vLLM could not serve it: the next ranked layer instead
        bar.total += len(kept)
        chosen = sorted([*chosen, nxt])
        with_skip = measure_skip(chosen)
        steps.append({"skip": list(chosen), "kl": with_skip.overall()["kl_mean"]})
    bar.close()

    layers = []
    for i in range(L):
        st = stats.layer_stats(i)
        layers.append({
            "index": i, "attention_type": passes.types[i],
            "k_amax": st.get("k_amax"), "v_amax": st.get("v_amax"),
            "sat_rate": st.get("sat_rate"), "ftz_rate": st.get("ftz_rate"),
            "kl_only_this": only[i], "kl_all_but_this": all_but[i],
            "removal_gain": kl_full - all_but[i], "score": scores[i],
            "top1_only_this": overall[f"only:{i}"]["top1_agree"],
            "top1_all_but_this": overall[f"all_but:{i}"]["top1_agree"],
            "kl_only_this_by_bucket": {b: v["kl_mean"] for b, v in results[f"only:{i}"].result().items()},
            "kl_all_but_this_by_bucket": {b: v["kl_mean"] for b, v in results[f"all_but:{i}"].result().items()},
            **{k: v for k, v in st.items() if k not in ("k_amax", "v_amax", "sat_rate", "ftz_rate")},
        })
    kl_sliding = overall["skip_sliding"]["kl_mean"] if hybrid else None
    kl_with = steps[-1]["kl"]
    return {
        "model": cfg.model.name, "kv": cfg.kv.name, "baseline": cfg.baseline, "engine": resolve_kind(cfg),
        "format": passes.arm.fmt, "scales": cfg.kv.scales, "attention": passes.arm.attention,
        "passages": [{"book": d.book, "length": d.length, "char_offset": d.char_offset, "key": d.key} for d in docs],
        "lengths": sorted(set(int(n) for n in s.lengths)), "documents": s.documents,
        "n_tokens": overall["full"]["n_tokens"],
        "passes": {"per_document_and_length": cost.per_unit, "total": cost.total + (len(steps) - 1) * len(docs),
                   "path": cost.path},
        "target": s.target, "rank_by": s.rank_by,
        "layers": layers,
        "ranking": order,
        "recommended_skip_layers": list(chosen),
        "ranked_skip_layers": ranked_choice,
        "feasibility": feas.summary(list(chosen)),
        "kl_full_fp8": kl_full,
        "kl_with_skip": kl_with,
        "kv_bytes_ratio": ranking.kv_bytes_ratio(values, list(chosen)),
        "kv_bytes_ratio_full_fp8": ranking.kv_bytes_ratio(values, []),
        "removed_share": _removed(kl_full, kl_with),
        "predicted_share": ranking.predicted_share(scores, list(chosen)),
        "target_met": _removed(kl_full, kl_with) >= s.target,
        "refine_steps": steps,
        "sum_kl_only_this": sum(only.values()),
        "full_fp8": {"overall": overall["full"], "buckets": results["full"].result()},
        "with_skip": {"overall": with_skip.overall(), "buckets": with_skip.result()},
        "per_passage_full_fp8": per_passage,
        "sliding_window": ranking.sliding_verdict(layers, order, list(chosen), scores, kl_full, kl_sliding),
        "ignored_kv_skip_layers": passes.ignored_skip,
        "edges": list(edges),
        "fingerprint": fp, "cache": str(cache.dir), "passages_reused": reused,
    }


def _named(name: str, measured) -> dict:
    return {f"{name}:kl": measured[0], f"{name}:top1": measured[1], f"{name}:dlogp": measured[2]}


def _measured(name: str, got: dict):
    return got[f"{name}:kl"], got[f"{name}:top1"], got[f"{name}:dlogp"]


def _records_root(cfg) -> Path:
    root = Path(cfg.records_dir).expanduser()
    return root if root.is_absolute() else Path.cwd() / root


def _removed(kl_full: float, kl: float) -> float:
    return 1.0 - kl / kl_full if kl_full > 0 else 1.0


def _bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="pass", disable=not enabled, file=sys.stderr, dynamic_ncols=True)

