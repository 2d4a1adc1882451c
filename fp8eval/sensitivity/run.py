"""The sensitivity flow: K/V statistics, 2 x layers + 2 passes per passage (document and length), ranking, the
recommended skip list re-measured (and grown while it falls short of the target, `sensitivity.refine`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

from fp8eval.divergence import measures as M
from fp8eval.sensitivity import ranking
from fp8eval.sensitivity.config import SensitivityRunConfig, validate
from fp8eval.sensitivity.kvstats import KVStatsAccumulator, recording_policy
from fp8eval.sensitivity.passes import Baseline, Passes, SensitivityError, compare


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
        """Prefill passes of the run without refinement: per passage, per_unit plus one to re-measure the recommended
        skip list."""
        return self.n_units * (self.per_unit + 1)

    def line(self, lengths: list[int], documents: int) -> str:
        """One line that tells the user what the run costs: passes per passage, passages and the total."""
        return (f"sensitivity: {self.n_layers} layers -> forward passes = 2 x {self.n_layers} + 2 = "
                f"{2 * self.n_layers + 2}{' + 1 (sliding-window layers in BF16)' if self.hybrid else ''} per "
                f"document and length, + 1 to re-measure the recommended skip list (+ up to {self.refine} more "
                f"if it falls short of the target); {documents} document(s) x lengths {sorted(set(lengths))} = "
                f"{self.n_units} passage(s): {self.total} prefill passes"
                f"{f' (up to {self.total + self.refine * self.n_units})' if self.refine else ''}")


def run(cfg: SensitivityRunConfig, baseline_kv, log: Callable[[str], None] = print) -> dict:
    """Measure everything and return the sensitivity.json content (written by `outputs`)."""
    s = cfg.sensitivity
    problems = validate(s)
    if problems:
        raise SensitivityError("; ".join(problems))
    too_long = [n for n in s.lengths if n > int(cfg.model.max_model_len)]
    if too_long:
        raise SensitivityError(f"sensitivity.lengths {too_long} exceed model.max_model_len={cfg.model.max_model_len}")
    edges = tuple(s.edges)
    passes = Passes(cfg, baseline_kv)
    if passes.ignored_skip:
        log(f"sensitivity: kv={cfg.kv.name} skips {passes.ignored_skip}; every layer is measured, so that list "
            f"is ignored here (the recommendation replaces it)")
    docs = passes.passages(s.documents, list(s.lengths))
    L = passes.n_layers
    sliding = [i for i, t in enumerate(passes.types) if "sliding" in t]
    hybrid = 0 < len(sliding) < L
    cost = Cost(L, len(docs), hybrid, s.refine)
    log(cost.line(list(s.lengths), s.documents))
    passes.check_head(docs[0].ids)

    stats = KVStatsAccumulator(fmt=passes.arm.fmt)
    configs = [("full", passes.fp8_policy([]))]
    configs += [(f"only:{i}", passes.only(i)) for i in range(L)]
    configs += [(f"all_but:{i}", passes.fp8_policy([i])) for i in range(L)]
    if hybrid:
        configs.append(("skip_sliding", passes.fp8_policy(["sliding_window"])))
    results = {name: M.BucketAccumulator(edges) for name, _ in configs}
    kept: list[tuple[object, Baseline]] = []
    per_passage: list[dict] = []
    bar = _bar(cost.total, s.progress)
    for doc in docs:
        bar.set_description(f"{doc.book.removesuffix('.txt')}@{doc.length}")
        base = Baseline(passes, passes.hidden(recording_policy(passes.bf16, passes.arm, stats), doc.ids),
                        s.cache_logits_gib)
        bar.update()
        for name, pol in configs:
            into = [results[name]]
            if name == "full":
                into.append(M.BucketAccumulator(edges))
            compare(passes, base, passes.hidden(pol, doc.ids), *into)
            if name == "full":
                per_passage.append({"book": doc.book, "length": doc.length, **into[1].overall()})
            bar.update()
        base.release()  # only the hidden states stay, for the re-measurement
        kept.append((doc, base))

    overall = {name: acc.overall() for name, acc in results.items()}
    kl_full = overall["full"]["kl_mean"]
    only = {i: overall[f"only:{i}"]["kl_mean"] for i in range(L)}
    all_but = {i: overall[f"all_but:{i}"]["kl_mean"] for i in range(L)}
    scores = ranking.layer_scores(kl_full, only, all_but, s.rank_by)
    order = ranking.rank(scores, tiebreak=only)
    chosen = ranking.smallest_skip_set(order, scores, s.target)
    values = {i: stats.kv_values_per_token(i) for i in range(L)}
    feas = _Feasibility(cfg, passes, s.feasibility)
    ranked_choice = list(chosen)
    chosen = feas.best(order, scores, s.target, values, chosen, log)

    def measure(skip: list[int]) -> M.BucketAccumulator:
        acc = M.BucketAccumulator(edges)
        for doc, base in kept:
            compare(passes, base, passes.hidden(passes.fp8_policy(skip), doc.ids), acc)
            bar.update()
        return acc

    with_skip = measure(chosen)
    steps = [{"skip": list(chosen), "kl": with_skip.overall()["kl_mean"]}]
    extra = [i for i in order if i not in chosen]
    while _removed(kl_full, steps[-1]["kl"]) < s.target and extra and len(steps) <= s.refine:
        nxt = extra.pop(0)
        if not feas.ok(sorted([*chosen, nxt])):
            continue  # vLLM could not serve it: the next ranked layer instead
        bar.total += len(kept)
        chosen = sorted([*chosen, nxt])
        with_skip = measure(chosen)
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
        "model": cfg.model.name, "kv": cfg.kv.name, "baseline": cfg.baseline, "engine": "reference",
        "format": passes.arm.fmt, "scales": cfg.kv.scales, "attention": passes.arm.attention,
        "passages": [{"book": d.book, "length": d.length, "char_offset": d.char_offset, "key": d.key} for d in docs],
        "lengths": sorted(set(int(n) for n in s.lengths)), "documents": s.documents,
        "n_tokens": overall["full"]["n_tokens"],
        "passes": {"per_document_and_length": cost.per_unit, "total": cost.total + (len(steps) - 1) * len(docs)},
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
    }


class _Feasibility:
    """Whether vLLM can serve a skip list (fp8eval.feasibility), memoised; `mode` is sensitivity.feasibility."""

    def __init__(self, cfg, passes, mode: str):
        from fp8eval.feasibility import Layout

        self.mode = mode
        c = passes.engine._model.config
        c = c.get_text_config() if hasattr(c, "get_text_config") else c
        types = tuple(f"sliding:{getattr(c, 'sliding_window', 0)}" if "sliding" in t else "full" for t in passes.types)
        heads = int(getattr(c, "num_key_value_heads", None) or c.num_attention_heads)
        head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
        self.layout = Layout(types, heads, head_dim)
        self.cache_dtype = passes.engine.cache_dtype
        self.full = [i for i, t in enumerate(types) if t == "full"]
        self.known: dict[tuple, object] = {}
        self.rejected: list[list[int]] = []

    def _python(self):
        if self.mode in ("auto", "oracle"):
            from fp8eval.engines.vllm.args import vllm_python

            return vllm_python()
        return None

    def _check(self, cands: list[list[int]]) -> None:
        from fp8eval.feasibility import check_many, rule_check

        todo = [c for c in cands if tuple(c) not in self.known]
        if not todo:
            return
        if self.mode == "off":
            got = [None] * len(todo)
        elif self.mode == "rule":
            got = [rule_check(self.layout, self.cache_dtype, c) for c in todo]
        else:
            got = check_many(self.layout, [(self.cache_dtype, c) for c in todo], self._python())
        for c, v in zip(todo, got):
            self.known[tuple(c)] = v

    def ok(self, skip: list[int]) -> bool:
        """Feasible (always, with sensitivity.feasibility=off)."""
        self._check([skip])
        v = self.known[tuple(skip)]
        if v is not None and not v.feasible:
            self.rejected.append(list(skip))
        return v is None or v.feasible

    def best(self, order, scores, target, values, chosen, log) -> list[int]:
        """The ranked choice if vLLM can serve it, else the best feasible list (ranking.best_feasible)."""
        if self.mode == "off" or self.ok(list(chosen)):
            return list(chosen)
        opts = ranking.feasible_options(order, self.full)
        self._check(opts)
        feasible = {tuple(o): (self.known[tuple(o)] is None or self.known[tuple(o)].feasible) for o in opts}
        best = ranking.best_feasible(opts, feasible, scores, target, values)
        why = self.known[tuple(chosen)].reason
        if best is None:
            raise SensitivityError(f"no skip list vLLM can serve was found for kv={self.cache_dtype} ({why})")
        log(f"sensitivity: the ranked skip list {list(chosen)} cannot be served ({why}); recommending the best "
            f"feasible one instead: {best}")
        return best

    def summary(self, chosen: list[int]) -> dict:
        """What sensitivity.json says about feasibility."""
        v = self.known.get(tuple(chosen))
        return {"mode": self.mode, "how": v.how if v else None, "reason": v.reason if v else "not checked",
                "checked": len(self.known), "rejected": self.rejected}


def _removed(kl_full: float, kl: float) -> float:
    return 1.0 - kl / kl_full if kl_full > 0 else 1.0


def _bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="pass", disable=not enabled, file=sys.stderr, dynamic_ncols=True)


def baseline_kv(name: str, model_name: str):
    """The baseline kv option, composed by Hydra as `python -m fp8eval` composes its baseline arm."""
    from fp8eval.arms import compose_kv

    return compose_kv(name, model_name)
