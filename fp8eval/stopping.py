"""`stop=sequential`: a paired run's samples go out in rounds, and each bucket stops once it is decided.

The runner asks `Rounds.items()` for the (sample, repeat) items of the current round, fills both arms with
them (resumable and exactly once, as any run), then calls `Rounds.advance(baseline, variant)`: every bucket
(the values of the context-length family, or the whole task) replays its samples in a fixed order, a
seeded shuffle `sha256(seed, sample id)`, through `metrics.sequential.decide`; a decided bucket takes no
more samples, an undecided one takes `round_size` more. A rerun on the same records replays the same
order, reaches the same decisions and sends only what the next undecided round needs. Samples with no
pair scored in both arms (skipped, errors) are left out of the sequence and counted.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Sequence

from fp8eval.core.errors import Fp8evalError
from fp8eval.metrics import sequential, verdict
from fp8eval.metrics.groups import length_family, split_label
from fp8eval.metrics.select import is_scored, one_per_key, record_key

MODES = ("fixed", "sequential")


class StopError(Fp8evalError):
    """stop=sequential cannot run with this configuration; the message says why."""


def check(stop, baseline_present: bool, shard: str | None) -> None:
    """Refuse an unknown stop mode, a sequential run without a baseline or in shards, nonsense sizes."""
    if stop.name not in MODES:
        raise StopError(f"stop.name={stop.name!r} is not one of {', '.join(MODES)}")
    if stop.name != "sequential":
        return
    if not baseline_present:
        raise StopError("stop=sequential compares a variant with its baseline; baseline=none has nothing to compare")
    if shard is not None:
        raise StopError("stop=sequential decides after each round from both arms' records; it cannot run in shards"
                        " (drop shard=, or use stop=fixed)")
    if int(stop.round_size) < 1:
        raise StopError(f"stop.round_size must be >= 1, got {stop.round_size}")


def order_key(seed: int, sample_id: str) -> str:
    """A sample's place in the sequence: sha256 of (seed, id), so the order is a fixed shuffle."""
    return hashlib.sha256(f"{seed}\x1f{sample_id}".encode("utf-8")).hexdigest()


class Rounds:
    """The state of a sequential run over planned items (each with `.sample.id`, `.sample.groups`)."""

    def __init__(self, items: Sequence, stop, stats, seed: int):
        self.stop, self.items_all = stop, list(items)
        self.design = sequential.Design(gate=float(stats.gate), alpha=float(stats.alpha), alpha_cs=float(stop.alpha_cs),
                                        cap=float(stop.cap)).check()
        self.right_at = float(stats.right_at)
        groups = {s.id: tuple(s.groups) for s in (it.sample for it in self.items_all)}
        labels = {g for gs in groups.values() for g in gs}
        self.family = (length_family(labels) if stop.by == "auto" else (stop.by or None))
        if stop.by not in ("auto", "") and not any(split_label(g)[0] == stop.by for g in labels):
            raise StopError(f"stop.by={stop.by!r} names no group family of this task's samples"
                            f" (labels: {', '.join(sorted(labels)[:8])})")
        self.order: dict[str, list[str]] = {}
        for sid in sorted(groups, key=lambda s: order_key(seed, s)):
            self.order.setdefault(self.bucket_of(groups[sid]), []).append(sid)
        if len(self.order) > 1:  # the run fails if any bucket fails: each bucket gets alpha / B (Bonferroni)
            b = len(self.order)
            self.design = dataclasses.replace(self.design, alpha=self.design.alpha / b,
                                              alpha_cs=self.design.alpha_cs / b).check()
        self.taken = {b: min(int(stop.round_size), len(ids)) for b, ids in self.order.items()}
        self.results: dict[str, sequential.SequentialResult] = {}
        self.rounds = 1

    def bucket_of(self, groups: tuple[str, ...]) -> str:
        """The bucket a sample stops with: its label of the stopping family, else 'all'."""
        if self.family:
            for g in groups:
                if split_label(g)[0] == self.family:
                    return g
        return "all"

    def items(self) -> list:
        """The planned items of every sample taken so far (all rounds, cumulative)."""
        chosen = {sid for b, ids in self.order.items() for sid in ids[: self.taken[b]]}
        return [it for it in self.items_all if it.sample.id in chosen]

    def advance(self, baseline: Sequence[dict], variant: Sequence[dict]) -> bool:
        """Decide every bucket from the records; take another round where undecided. True when a bucket
        grew (the runner fills the arms again), False when every bucket is decided or out of samples."""
        pairs = _pairs_by_sample(baseline, variant)
        grew = False
        for b, ids in self.order.items():
            seen = [pairs[s] for s in ids[: self.taken[b]] if s in pairs]
            res = sequential.decide(seen, self.design, len(ids), self.right_at)
            if res.decision == "continue" and self.taken[b] == len(ids):  # out of samples (some unpaired)
                res = (sequential.decide(seen, self.design, len(seen), self.right_at) if seen else
                       dataclasses.replace(res, decision="inconclusive", how="no paired sample"))
            self.results[b] = res
            if res.decision == "continue" and self.taken[b] < len(ids):
                self.taken[b] = min(len(ids), self.taken[b] + int(self.stop.round_size))
                grew = True
        self.rounds += int(grew)
        return grew

    def summary(self, baseline: Sequence[dict], variant: Sequence[dict], ver: dict | None = None) -> dict:
        """summary.json's `sequential` block: per bucket the decision, samples used and planned, the e-values
        and the confidence sequence's recovery bounds; overall: fail if any bucket fails, pass if all pass.
        `ver`: the run's verdict block, whose `decision` becomes this one (the run's one decision)."""
        pairs = _pairs_by_sample(baseline, variant)
        out = {}
        for b, ids in self.order.items():
            res = self.results.get(b)
            seen = [pairs[s] for s in ids[: self.taken[b]] if s in pairs]
            low, high = sequential.cs_bounds(seen, self.design) if seen else (None, None)
            out[b] = {**(res.as_dict() if res else {"decision": "continue"}),
                      "samples_sent": self.taken[b], "samples_planned": len(ids),
                      "samples_unpaired": self.taken[b] - len(seen), "cs_low": low, "cs_high": high}
        decisions = [v["decision"] for v in out.values()]
        overall = ("fail" if "fail" in decisions else "pass" if decisions and all(d == "pass" for d in decisions)
                   else "inconclusive")
        seq = {"design": {**self.design.__dict__, "alpha_final": self.design.alpha_final,
                          "round_size": int(self.stop.round_size), "buckets": len(self.order)},
               "by": self.family or "", "rounds": self.rounds, "decision": overall, "buckets": out,
               "samples_sent": sum(self.taken.values()),
               "samples_planned": sum(len(ids) for ids in self.order.values())}
        verdict.set_sequential_decision(ver, seq)
        return seq


def _pairs_by_sample(baseline: Sequence[dict], variant: Sequence[dict]) -> dict[str, list[tuple[float, float]]]:
    """{sample id: [(baseline score, variant score) per repeat scored in both arms]}."""
    base = {record_key(r): r for r in one_per_key(baseline)[0] if is_scored(r)}
    out: dict[str, list[tuple[float, float]]] = {}
    for r in one_per_key(variant)[0]:
        k = record_key(r)
        if is_scored(r) and k in base:
            out.setdefault(k[0], []).append((float(base[k]["score"]), float(r["score"])))
    return out
