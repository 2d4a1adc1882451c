"""Sequential stopping (`stop=sequential`) against fixed n, on simulated paired outcomes with a known truth.

    PYTHONPATH=$PWD python benchmarks/sequential.py --runs 2000 --out benchmarks/results_sequential.json

A paired-Bernoulli simulator: the baseline is right with probability p_b; a right baseline answer is lost
by the variant with probability l, a wrong one gained with probability gam (gam fixed, l set so the
variant's recovery is the scenario's truth). For each truth, `runs` runs of

- fixed n: n_fixed pairs (Miller's formula for the planned distance delta from the gate, alpha, power),
  judged by the Bonett-Price CI at 1 - alpha, the verdict summary.json gives;
- sequential: pairs one at a time through `fp8eval.metrics.sequential` (the betting e-processes, checked
  after every pair), stopped at the first crossing or at n_max, where the Bonett-Price CI at
  1 - alpha_final decides.

It prints one JSON line per (design, truth): error rate at the gate (any decision there is wrong), the
probability of the right decision elsewhere (power at gate +- delta), and the mean pairs used; then a
summary line with the ratios the issue asks for. Vectorised with numpy: 2,000 runs take seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from fp8eval.metrics import intervals
from fp8eval.metrics.power import z_sum
from fp8eval.metrics.sequential import Design, first_crossing, log_capital, n_max_for


def bp_vec(both: np.ndarray, gained: np.ndarray, lost: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Bonett-Price hybrid Wilson CI of the paired ratio, vectorised (intervals.bonett_price_ratio)."""
    n1, n2, ns = both + gained, both + lost, both + gained + lost
    a = np.sqrt((gained + lost + 2.0) / ((n1 + 1.0) * (n2 + 1.0)))
    b = np.sqrt(np.maximum(1.0 - (n1 + 1.0) / (ns + 2.0), 0) / (n1 + 1.0))
    c = np.sqrt(np.maximum(1.0 - (n2 + 1.0) / (ns + 2.0), 0) / (n2 + 1.0))
    z = a / (b + c) * intervals.z_quantile(0.5 + level / 2.0)

    def lim(x, sign):
        root = z * np.sqrt(z * z + 4 * x * (1 - x / np.maximum(ns, 1)))
        return (2 * x + z * z + sign * root) / (2 * (ns + z * z))

    l1, u1, l2, u2 = lim(n1, -1), lim(n1, 1), lim(n2, -1), lim(n2, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return 100 * np.where(u2 > 0, l1 / u2, 0.0), 100 * np.where(l2 > 0, u1 / l2, np.inf)


def scenario(p_b: float, gam: float, recovery: float) -> float:
    """The loss probability l that gives this recovery % (with gains gam on wrong baseline answers)."""
    lost = 1.0 - (recovery / 100.0 * p_b - (1.0 - p_b) * gam) / p_b
    if not 0.0 <= lost <= 1.0:
        raise ValueError(f"recovery {recovery} is out of reach with p_b={p_b}, gam={gam}")
    return lost


def contrast_var(p_b: float, gam: float, lost: float, g: float) -> tuple[float, float]:
    """(mean, variance) of x = v - g b for one pair."""
    outcomes = [(p_b * (1 - lost), 1 - g), (p_b * lost, -g), ((1 - p_b) * gam, 1.0), ((1 - p_b) * (1 - gam), 0.0)]
    mean = sum(p * x for p, x in outcomes)
    return mean, sum(p * x * x for p, x in outcomes) - mean ** 2


def n_fixed_for(p_b: float, gam: float, gate: float, delta: float, alpha: float, power: float) -> int:
    """Miller's n for the planned distance delta (recovery points) on either side of the gate."""
    g, n = gate / 100.0, 0
    for truth in (gate - delta, gate + delta):
        mean, var = contrast_var(p_b, gam, scenario(p_b, gam, truth), g)
        n = max(n, math.ceil(z_sum(alpha, power) ** 2 * var / mean ** 2))
    return n


def simulate(truth: float, p_b: float, gam: float, gate: float, n_fixed: int, n_max: int, design: Design,
             runs: int, rng: np.random.Generator) -> dict:
    """One truth: fixed-n and sequential decisions over `runs` simulated runs."""
    lost_p = scenario(p_b, gam, truth)
    n = max(n_fixed, n_max)
    b = rng.random((runs, n)) < p_b
    u = rng.random((runs, n))
    v = np.where(b, u >= lost_p, u < gam)
    both, gained, lost = (b & v), (~b & v), (b & ~v)
    cb, cg, cl = (np.cumsum(a, axis=1, dtype=float) for a in (both, gained, lost))

    def verdict(lo, hi):
        return np.where(lo >= gate, 1, np.where(hi < gate, -1, 0))  # 1 pass, -1 fail, 0 inconclusive

    fixed = verdict(*bp_vec(cb[:, n_fixed - 1], cg[:, n_fixed - 1], cl[:, n_fixed - 1], 1 - design.alpha))
    g = gate / 100.0
    x = v[:, :n_max].astype(float) - g * b[:, :n_max].astype(float)
    lp, lm = log_capital(x, g, design)
    thr = math.log(2.0 / design.alpha_cs)
    tp, tm = first_crossing(lp, thr), first_crossing(lm, thr)
    tp_ = np.where(tp > 0, tp, n_max + 1)
    tm_ = np.where(tm > 0, tm, n_max + 1)
    crossed = (tp > 0) | (tm > 0)
    last = verdict(*bp_vec(cb[:, n_max - 1], cg[:, n_max - 1], cl[:, n_max - 1], 1 - design.alpha_final))
    seq = np.where(crossed, np.where(tp_ <= tm_, 1, -1), last)
    used = np.where(crossed, np.minimum(tp_, tm_), n_max)
    right = 0 if truth == gate else (1 if truth > gate else -1)

    def rates(dec: np.ndarray) -> dict:
        return {"pass": float((dec == 1).mean()), "fail": float((dec == -1).mean()),
                "inconclusive": float((dec == 0).mean()),
                "error": float((dec != 0).mean()) if right == 0 else float((dec == -right).mean()),
                "right": None if right == 0 else float((dec == right).mean())}

    return {"truth_recovery": truth, "loss_prob": round(lost_p, 6), "runs": runs,
            "fixed": {**rates(fixed), "pairs": n_fixed},
            "sequential": {**rates(seq), "pairs_mean": float(used.mean()), "pairs_p90": float(np.quantile(used, 0.9)),
                           "stopped_by_cs": float(crossed.mean())},
            "requests_ratio_fixed_over_seq": round(n_fixed / float(used.mean()), 3)}


def main(argv=None) -> int:
    """Simulate every truth and print JSON lines (and write them to --out)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--p-baseline", type=float, default=0.8)
    p.add_argument("--gain", type=float, default=0.02, help="P(variant right | baseline wrong)")
    p.add_argument("--gate", type=float, default=95.0)
    p.add_argument("--delta", type=float, default=2.5, help="planned distance from the gate, recovery points")
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--alpha-cs", type=float, default=0.01)
    p.add_argument("--cap", type=float, default=0.8, help="the betting fraction's cap (Design.cap)")
    p.add_argument("--power", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    design = Design(gate=args.gate, alpha=args.alpha, alpha_cs=args.alpha_cs, cap=args.cap).check()
    n_fixed = n_fixed_for(args.p_baseline, args.gain, args.gate, args.delta, args.alpha, args.power)
    n_max = n_max_for(n_fixed, design, args.power)
    rng = np.random.default_rng(args.seed)
    d = args.delta
    truths = [args.gate, args.gate + d, args.gate - d, args.gate + 2 * d, args.gate - 2 * d, args.gate - 4 * d]
    lines = [{"bench": "sequential", "design": {**design.__dict__, "alpha_final": design.alpha_final},
              "p_baseline": args.p_baseline, "gain": args.gain, "delta": d, "power": args.power,
              "n_fixed": n_fixed, "n_max": n_max, "n_max_over_n_fixed": round(n_max / n_fixed, 3)}]
    for truth in truths:
        lines.append({"bench": "sequential", **simulate(truth, args.p_baseline, args.gain, args.gate, n_fixed,
                                                        n_max, design, args.runs, rng)})
    at_gate = lines[1]
    far = [r for r in lines[1:] if abs(r["truth_recovery"] - args.gate) >= 2 * d - 1e-9]
    lines.append({"bench": "sequential", "summary": True,
                  "type1_fixed": at_gate["fixed"]["error"], "type1_sequential": at_gate["sequential"]["error"],
                  "power_fixed_at_planned": [r["fixed"]["right"] for r in lines[2:4]],
                  "power_sequential_at_planned": [r["sequential"]["right"] for r in lines[2:4]],
                  "requests_ratio_at_gate_seq_over_fixed": round(at_gate["sequential"]["pairs_mean"] / n_fixed, 3),
                  "requests_ratio_far_fixed_over_seq": {str(r["truth_recovery"]): r["requests_ratio_fixed_over_seq"]
                                                        for r in far},
                  "meets_2x_far": all(r["requests_ratio_fixed_over_seq"] >= 2 for r in far),
                  "meets_1_2x_at_gate": at_gate["sequential"]["pairs_mean"] / n_fixed <= 1.2,
                  "wall_s": round(time.perf_counter() - t0, 2)})
    for line in lines:
        print(json.dumps(line))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
