"""The sensitivity flow: K/V statistics, 2 x layers + 2 passes per document prefix, ranking, the
recommended skip list re-measured (and grown while it falls short of the target, `sensitivity.refine`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

from fp8eval.sensitivity import measures, ranking
from fp8eval.sensitivity.config import SensitivityRunConfig, validate
from fp8eval.sensitivity.kvstats import KVStatsAccumulator, recording_policy
from fp8eval.sensitivity.passes import Baseline, BucketSums, Passes, SensitivityError, Unit, compare


@dataclass
class Cost:
    n_layers: int
    n_units: int
    hybrid: bool
    refine: int

    @property
    def per_unit(self) -> int:
        """BF16 + full FP8 + per layer (only this, all but this) [+ sliding-window layers in BF16]."""
        return 2 * self.n_layers + 2 + (1 if self.hybrid else 0)

    @property
    def total(self) -> int:
        return self.n_units * (self.per_unit + 1)

    def line(self, lengths: list[int], documents: int) -> str:
        return (f"sensitivity: {self.n_layers} layers -> forward passes = 2 x {self.n_layers} + 2 = "
                f"{2 * self.n_layers + 2}{' + 1 (sliding-window layers in BF16)' if self.hybrid else ''} per "
                f"document and length, + 1 to re-measure the recommended skip list (+ up to {self.refine} more "
                f"if it falls short of the target); {documents} document(s) x lengths {sorted(set(lengths))} = "
                f"{self.n_units} prefix(es): {self.total} prefill passes"
                f"{f' (up to {self.total + self.refine * self.n_units})' if self.refine else ''}")


def run(cfg: SensitivityRunConfig, baseline_kv, log: Callable[[str], None] = print) -> dict:
    """Measure everything and return the sensitivity.json content (written by `outputs`)."""
    s = cfg.sensitivity
    problems = validate(s)
    if problems:
        raise SensitivityError("; ".join(problems))
    edges = list(s.buckets) if s.buckets else list(measures.DEFAULT_EDGES)
    passes = Passes(cfg, baseline_kv)
    if passes.ignored_skip:
        log(f"sensitivity: kv={cfg.kv.name} skips {passes.ignored_skip}; every layer is measured, so that list "
            f"is ignored here (the recommendation replaces it)")
    units = passes.units(s.documents, list(s.lengths))
    L = passes.n_layers
    sliding = [i for i, t in enumerate(passes.types) if "sliding" in t]
    hybrid = 0 < len(sliding) < L
    cost = Cost(L, len(units), hybrid, s.refine)
    log(cost.line(list(s.lengths), s.documents))
    passes.check_head(units[0].ids)

    stats = KVStatsAccumulator(fmt=passes.arm.fmt)
    results: dict[str, BucketSums] = {}
    kept: list[tuple[Unit, object]] = []
    per_unit_full: list[dict] = []
    bar = _bar(cost.total, s.progress)
    for u in units:
        bar.set_description(u.label)
        pol = recording_policy(passes.bf16, passes.arm, stats) if u.collect_stats else passes.bf16
        base = Baseline(passes, passes.hidden(pol, u.ids), s.cache_logprobs_gib)
        bar.update()
        configs = [("full", passes.fp8_policy([]))]
        configs += [(f"only:{i}", passes.only(i)) for i in range(L)]
        configs += [(f"all_but:{i}", passes.fp8_policy([i])) for i in range(L)]
        if hybrid:
            configs.append(("skip_sliding", passes.fp8_policy(["sliding_window"])))
        for name, pol in configs:
            sums = compare(passes, base, passes.hidden(pol, u.ids), edges)
            results.setdefault(name, BucketSums(edges)).merge(sums)
            if name == "full":
                per_unit_full.append({"document": u.label, "length": u.length, **sums.overall()})
            bar.update()
        base._chunks.clear()  # keep only the hidden states for the re-measurement
        kept.append((u, base))

    kl_full = results["full"].overall()["kl_mean"]
    only = {i: results[f"only:{i}"].overall()["kl_mean"] for i in range(L)}
    all_but = {i: results[f"all_but:{i}"].overall()["kl_mean"] for i in range(L)}
    scores = ranking.layer_scores(kl_full, only, all_but, s.rank_by)
    order = ranking.rank(scores, tiebreak=only)
    chosen = ranking.smallest_skip_set(order, scores, s.target)

    def measure(skip: list[int]) -> BucketSums:
        total = BucketSums(edges)
        for u, base in kept:
            total.merge(compare(passes, base, passes.hidden(passes.fp8_policy(skip), u.ids), edges))
            bar.update()
        return total

    steps = []
    with_skip = measure(chosen)
    steps.append({"skip": list(chosen), "kl": with_skip.overall()["kl_mean"]})
    extra = [i for i in order if i not in chosen]
    while _removed(kl_full, steps[-1]["kl"]) < s.target and extra and len(steps) <= s.refine:
        bar.total += len(kept)
        chosen = sorted([*chosen, extra.pop(0)])
        with_skip = measure(chosen)
        steps.append({"skip": list(chosen), "kl": with_skip.overall()["kl_mean"]})
    bar.close()

    values = {i: stats.kv_values_per_token(i) for i in range(L)}
    layers = []
    for i in range(L):
        st = stats.layer_stats(i)
        layers.append({
            "index": i, "attention_type": passes.types[i],
            "k_amax": st.get("k_amax"), "v_amax": st.get("v_amax"),
            "sat_rate": st.get("sat_rate"), "ftz_rate": st.get("ftz_rate"),
            "kl_only_this": only[i], "kl_all_but_this": all_but[i],
            "removal_gain": kl_full - all_but[i], "score": scores[i],
            "top1_only_this": results[f"only:{i}"].overall()["top1_agree"],
            "top1_all_but_this": results[f"all_but:{i}"].overall()["top1_agree"],
            "kl_only_this_by_bucket": {b: v["kl_mean"] for b, v in results[f"only:{i}"].table().items()},
            "kl_all_but_this_by_bucket": {b: v["kl_mean"] for b, v in results[f"all_but:{i}"].table().items()},
            **{k: v for k, v in st.items() if k not in ("k_amax", "v_amax", "sat_rate", "ftz_rate")},
        })
    kl_sliding = results["skip_sliding"].overall()["kl_mean"] if hybrid else None
    kl_with = steps[-1]["kl"]
    return {
        "model": cfg.model.name, "kv": cfg.kv.name, "baseline": cfg.baseline, "engine": "reference",
        "format": passes.arm.fmt, "scales": cfg.kv.scales,
        "documents": sorted({u.label.split("@")[0] for u in units}), "lengths": sorted(set(int(n) for n in s.lengths)),
        "n_tokens": results["full"].overall()["n_tokens"],
        "passes": {"per_document_and_length": cost.per_unit, "total": cost.total + (len(steps) - 1) * len(units)},
        "target": s.target, "rank_by": s.rank_by,
        "layers": layers,
        "ranking": order,
        "recommended_skip_layers": list(chosen),
        "kl_full_fp8": kl_full,
        "kl_with_skip": kl_with,
        "kv_bytes_ratio": ranking.kv_bytes_ratio(values, list(chosen)),
        "kv_bytes_ratio_full_fp8": ranking.kv_bytes_ratio(values, []),
        "removed_share": _removed(kl_full, kl_with),
        "predicted_share": ranking.predicted_share(scores, list(chosen)),
        "target_met": _removed(kl_full, kl_with) >= s.target,
        "refine_steps": steps,
        "sum_kl_only_this": sum(only.values()),
        "full_fp8": {"overall": results["full"].overall(), "buckets": results["full"].table()},
        "with_skip": {"overall": with_skip.overall(), "buckets": with_skip.table()},
        "per_unit_full_fp8": per_unit_full,
        "sliding_window": ranking.sliding_verdict(layers, order, list(chosen), scores, kl_full, kl_sliding),
        "ignored_kv_skip_layers": passes.ignored_skip,
        "bucket_edges": edges,
    }


def _removed(kl_full: float, kl: float) -> float:
    return 1.0 - kl / kl_full if kl_full > 0 else 1.0


def _bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="pass", disable=not enabled, file=sys.stderr, dynamic_ncols=True)


def baseline_kv(name: str):
    """The baseline kv option, read as `python -m fp8eval` reads it."""
    from fp8eval.runner import load_kv

    return load_kv(name)

