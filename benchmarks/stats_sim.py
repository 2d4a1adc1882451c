"""Every statistical claim of docs/statistics.md, checked by simulation against the project's own functions.

    PYTHONPATH=$PWD python benchmarks/stats_sim.py --runs 1000 --out benchmarks/results_stats_sim.json
    PYTHONPATH=$PWD python benchmarks/stats_sim.py --runs 200 --fast      # the slice tests/test_stats_round_two.py runs

Each cell draws paired records from a known truth and judges them with what a run uses: the verdict's CI
(`intervals.recovery_ci` after `intervals.collapse_repeats`, as `metrics.verdict.entry` does) and the one gate
rule (`verdict.decide`); the sequential design with `metrics.sequential.decide`; the control arm with
`metrics.noise.control_comparison`. Gate 95 %, alpha 0.05, power 0.8. The designs:

- binary n: n samples, one greedy record each: baseline right with p_b = 0.8, a right answer lost with the
  probability that gives the true recovery (one-way losses: FP8 only loses, the usual case);
- greedy x k: the same, each sample repeated k times with the same answer (greedy decoding);
- questions x k: sampled repeats; question i has its own rate p_i (uniform 0.1-0.9), the arms share the seed
  (the variant repeats the baseline's record) except on questions FP8 loses whole (all k records wrong):
  repeats move together;
- cells c x m: NIAH cells of m needles on one haystack; a cell is lost whole (its needles all wrong);
- sequential default: one bucket (`stop.by=""`), rounds of 16, n_max 300 and 1,326 planned samples (the
  latter section 6's benchmark design), binary records.

Claims (one JSON line per cell, then the table docs/statistics.md holds):
- `keep@90`: P(pass) at a true recovery of 90 % (must be <= 2.5 %);
- `pass@gate` / `fail@gate`: P(pass) / P(fail) at exactly the gate (each a one-sided error; nominal 2.5 %);
- `coverage`: P(the CI holds the true recovery) at 90 / 95 / 100 % (nominal 95 %);
- `mde_power`: the printed MDE's claim (`metrics.detect`): for a run of the design drawn at a true 100 % and
  one at 90 %, P(its recovery CI ends below 100 %, `decide` against a 100 % gate) at a drop equal to the MDE
  it prints, under the truth the claim states (`truth_of_mde`: each cluster's arms swapped at random, then
  whole clusters lost at random; claim 80 %, MDE_RUNS draws); beside it, not claimed, the same in fresh runs
  of the design (new baselines, the design's own loss model);
- `more_samples`: P(decided) after the `more_samples` a pilot prints, drawn at its own rates, against the
  chance it prints with it (`more_samples_chance`; the fewest samples reaching 80 %): binary tables, and
  clustered pilots whose added clusters are drawn from their own (PILOT_RUNS draws);
- sequential: P(pass) / P(fail) and the mean samples sent at 90 / 95 / 100 %, against the fixed n.
- control arm with repeats: coverage of the excess flip rate's CI and of the net loss's CI (nominal 95 %).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from fp8eval.metrics import intervals, noise, sequential, verdict

GATE = 95.0
ST = verdict.GateSettings(gate=GATE)
P_B = 0.8
MDE_RUNS = 4000  # draws behind each check of the MDE's claim (Monte Carlo error about 0.6 points at 80 %)
PILOT_RUNS = 2000  # draws behind each clustered more_samples check (about 0.9 points at 80 %)
SEQ_TRUTHS = (0.85, 0.90, 0.925, 0.95, 0.975, 1.0)  # the sequential rows' true recoveries


# --- data generating models: lists of (cluster, baseline, variant, sample) ----------------------------
def binary(rng, n: int, rec: float, k: int = 1) -> list[tuple]:
    """n samples, k identical (greedy) repeats each; one-way losses at 1 - rec of right answers."""
    b = rng.random(n) < P_B
    v = b & (rng.random(n) >= 1.0 - rec)
    return [(str(i), float(b[i]), float(v[i]), str(i)) for i in range(n) for _ in range(k)]


def questions(rng, n: int, k: int, rec: float) -> list[tuple]:
    """Sampled repeats that move together: question i at rate p_i, seeded arms agree, lost questions lose all."""
    p = rng.uniform(0.1, 0.9, n)
    lost = rng.random(n) < 1.0 - rec
    out = []
    for i in range(n):
        b = rng.random(k) < p[i]
        for r in range(k):
            out.append((str(i), float(b[r]), 0.0 if lost[i] else float(b[r]), str(i)))
    return out


def cells(rng, c: int, m: int, rec: float) -> list[tuple]:
    """c NIAH cells of m needles (baseline right 0.9 each); a lost cell loses every needle."""
    out = []
    for j in range(c):
        b = rng.random(m) < 0.9
        gone = rng.random() < 1.0 - rec
        out += [(f"cell{j}", float(b[i]), 0.0 if gone else float(b[i]), f"cell{j}/n{i}") for i in range(m)]
    return out


def judge(recs: list[tuple], level: float = 0.95) -> intervals.RecoveryCI:
    """The verdict's CI of the records, as metrics.verdict.entry computes it."""
    pairs = intervals.collapse_repeats([r[:3] for r in recs], [r[3] for r in recs])
    return intervals.recovery_ci(pairs, level)


DESIGNS = {  # name -> (generator(rng, rec), what a user sees)
    "binary n=9": lambda rng, rec: binary(rng, 9, rec),
    "binary n=30": lambda rng, rec: binary(rng, 30, rec),
    "binary n=100": lambda rng, rec: binary(rng, 100, rec),
    "binary n=500": lambda rng, rec: binary(rng, 500, rec),
    "greedy 9 x 8": lambda rng, rec: binary(rng, 9, rec, k=8),
    "questions 9 x 10": lambda rng, rec: questions(rng, 9, 10, rec),
    "questions 30 x 5": lambda rng, rec: questions(rng, 30, 5, rec),
    "questions 120 x 8": lambda rng, rec: questions(rng, 120, 8, rec),
    "cells 9 x 4": lambda rng, rec: cells(rng, 9, 4, rec),
    "cells 30 x 10": lambda rng, rec: cells(rng, 30, 10, rec),
}
FAST = ("binary n=9", "greedy 9 x 8", "questions 9 x 10", "cells 9 x 4")


def true_recovery(design: str, rec: float) -> float:
    """The design's true recovery % (every model loses a share 1 - rec of what the baseline gets right)."""
    return 100.0 * rec


def fixed_cell(design: str, runs: int, seed: int, mde_runs: int = MDE_RUNS) -> dict:
    """keep@90, pass@gate, coverage at 90/95/100 for one fixed-n design."""
    gen = DESIGNS[design]
    out: dict = {"design": design, "runs": runs}
    for rec in (0.90, 0.95, 1.0):
        rng = np.random.default_rng([seed, int(rec * 1000)])
        passes = fails = covers = defined = 0
        for _ in range(runs):
            recs = gen(rng, rec)
            if sum(r[1] for r in recs) == 0:
                continue
            ci = judge(recs)
            defined += 1
            said = verdict.decide(ci.low, ci.high, GATE)
            passes += said == "pass"
            fails += said == "fail"
            covers += ci.low <= true_recovery(design, rec) <= ci.high
        tag = {0.90: "90", 0.95: "gate", 1.0: "100"}[rec]
        out[f"pass@{tag}"] = round(passes / max(defined, 1), 4)
        out[f"coverage@{tag}"] = round(covers / max(defined, 1), 4)
        if tag == "gate":
            out["fail@gate"] = round(fails / max(defined, 1), 4)
    out["keep@90"] = out.pop("pass@90")
    out["mde_power"] = mde_power(design, runs, seed, mde_runs)
    return out


def truth_of_mde(rng, recs: list[tuple], q: float) -> list[tuple]:
    """The truth the printed MDE states (metrics.detect): each cluster's arms swapped with probability 1/2,
    then the cluster lost whole (every variant record 0) with probability q."""
    by: dict[str, list[tuple]] = {}
    for r in recs:
        by.setdefault(r[0], []).append(r)
    out = []
    for c, rs in by.items():
        swap, lost = rng.random() < 0.5, rng.random() < q
        out += [(c, v if swap else b, 0.0 if lost else (b if swap else v), s) for _, b, v, s in rs]
    return out


def detected(recs: list[tuple]) -> bool:
    """What the MDE claims to detect: the verdict's CI ends below 100 % (`decide` against a 100 % gate)."""
    ci = judge(recs)
    return verdict.decide(ci.low, ci.high, 100.0) == "fail"


def mde_power(design: str, runs: int, seed: int, truth_runs: int | None = None) -> dict:
    """The printed MDE's claim, checked: for a run of the design drawn at a true 100 % and one at 90 %, the MDE
    it prints and P(detected) at that drop under the truth the claim states (`truth_of_mde`, `truth_runs`
    draws; claim 80 %); and, not claimed, P(detected) in fresh runs of the design at that drop (its own
    generator: new baselines, the design's loss model; `runs` draws)."""
    gen = DESIGNS[design]
    out: dict = {}
    for rec in (1.0, 0.9):
        rng = np.random.default_rng([seed, 7, int(rec * 100)])
        recs = gen(rng, rec)
        e = verdict.entry([r[:3] for r in recs], ST, sample_ids=[r[3] for r in recs])
        tag = {1.0: "100", 0.9: "90"}[rec]
        if e["mde_pts"] is None:
            out[tag] = {"mde_pts": None}
            continue
        pre = sum(r[1] + r[2] for r in recs) / 2.0 / len(recs)
        q = min(1.0, e["mde_pts"] / 100.0 / pre)
        hits = sum(detected(truth_of_mde(rng, recs, q)) for _ in range(truth_runs or runs))
        base = sum(r[1] for r in recs) / len(recs)
        fresh = max(0.0, 1.0 - e["mde_pts"] / 100.0 / base)
        other = sum(detected(gen(rng, fresh)) for _ in range(runs))
        out[tag] = {"mde_pts": e["mde_pts"], "power": round(hits / (truth_runs or runs), 4),
                    "fresh_power": round(other / runs, 4)}
    return out


PILOTS = {  # the more_samples claim: pilot tables (both, lost, gained, neither)
    "default run 6/1/0/2": (6, 1, 0, 2),
    "30 pairs 25/2/0/3": (25, 2, 0, 3),
    "60 pairs 50/1/0/9": (50, 1, 0, 9),
    "fake engine, no flip 9/0/0/0": (9, 0, 0, 0),
}


def more_samples_cell(name: str, runs: int, seed: int) -> dict:
    """P(decided) when the pilot's table gets the `more_samples` it printed, drawn at its own rates."""
    both, lost, gained, neither = PILOTS[name]
    pilot = [(1.0, 1.0)] * both + [(1.0, 0.0)] * lost + [(0.0, 1.0)] * gained + [(0.0, 0.0)] * neither
    pairs = [(str(i), b, v) for i, (b, v) in enumerate(pilot)]
    e = verdict.entry(pairs, ST)
    more = e["more_samples"]
    if more is None:
        return {"pilot": name, "more_samples": None}
    rng = np.random.default_rng([seed, 11])
    probs = np.array([both, lost, gained, neither], float) / len(pilot)
    hits = 0
    for _ in range(runs):
        add = rng.multinomial(more, probs)
        b2, l2, g2 = both + add[0], lost + add[1], gained + add[2]
        pairs2 = ([("x", 1.0, 1.0)] * b2 + [("x", 1.0, 0.0)] * l2 + [("x", 0.0, 1.0)] * g2
                  + [("x", 0.0, 0.0)] * (neither + add[3]))
        ci = intervals.recovery_ci([(str(i), b, v) for i, (_, b, v) in enumerate(pairs2)])  # the verdict's CI
        hits += verdict.decide(ci.low, ci.high, GATE) in ("pass", "fail")
    return {"pilot": name, "more_samples": more, "p_decided": round(hits / runs, 4), "claim": e["more_samples_chance"]}


CLUSTERED_PILOTS = {  # the more_samples claim on clustered data: (design, true recovery); the pilot is the
    # first inconclusive run of the design among seeds [seed, 13, t]
    "questions 30 x 5 at 90 %": ("questions 30 x 5", 0.90),
    "questions 9 x 10 at 90 %": ("questions 9 x 10", 0.90),
    "cells 30 x 10 at 95 %": ("cells 30 x 10", 0.95),
}


def clustered_more_cell(name: str, runs: int, seed: int) -> dict:
    """P(decided) when a clustered pilot gets the `more_samples` it printed: that many samples' clusters drawn
    from its own (its observed rates as the truth), judged by the verdict's CI and `decide` (claim 80 %)."""
    design, rec = CLUSTERED_PILOTS[name]
    for t in range(50):
        rng = np.random.default_rng([seed, 13, t])
        recs = DESIGNS[design](rng, rec)
        samples = len({r[3] for r in recs})
        e = verdict.entry([r[:3] for r in recs], ST, samples, [r[3] for r in recs])
        if e["verdict"] == "inconclusive" and e["more_samples"] is not None:
            break
    else:
        return {"pilot": name, "more_samples": None}
    by: dict[str, list[tuple]] = {}
    for r in recs:
        by.setdefault(r[0], []).append(r)
    keys = list(by)
    add = math.ceil(e["more_samples"] * len(keys) / samples)
    hits = 0
    for i in range(runs):
        pick = rng.integers(0, len(keys), add)
        new = recs + [(f"+{j}", b, v, f"+{j}/{s}") for j, p in enumerate(pick) for _, b, v, s in by[keys[p]]]
        ci = judge(new)
        hits += verdict.decide(ci.low, ci.high, GATE) in ("pass", "fail")
    return {"pilot": f"{name} (CI {e['ci_low']:.1f}-{e['ci_high']:.1f} %)", "more_samples": e["more_samples"],
            "p_decided": round(hits / runs, 4), "claim": e["more_samples_chance"]}


def sequential_cell(runs: int, seed: int, n_max: int = 300, round_size: int = 16,
                    truths: tuple[float, ...] = (0.90, 0.95, 1.0)) -> list[dict]:
    """The default sequential design (one bucket, rounds of 16) against the fixed n: decisions and samples."""
    design = sequential.Design(gate=GATE)
    rows = []
    for rec in truths:
        rng = np.random.default_rng([seed, 3, int(rec * 1000), n_max])
        dec = {"pass": 0, "fail": 0, "inconclusive": 0}
        fixed = {"pass": 0, "fail": 0, "inconclusive": 0}
        sent = 0
        for _ in range(runs):
            recs = binary(rng, n_max, rec)
            res = sequential.decide([[(b, v)] for _, b, v, _ in recs], design, n_max)
            dec[res.decision] += 1
            sent += n_max if res.how != "confidence sequence" else min(n_max, math.ceil(res.n_used / round_size)
                                                                             * round_size)
            ci = judge(recs)
            fixed[verdict.decide(ci.low, ci.high, GATE)] += 1
        rows.append({"design": f"sequential default (1 bucket, rounds of {round_size}, n_max {n_max})",
                     "truth": 100 * rec, "runs": runs, "pass": round(dec["pass"] / runs, 4),
                     "fail": round(dec["fail"] / runs, 4), "mean_sent": round(sent / runs, 1),
                     "fixed_pass": round(fixed["pass"] / runs, 4), "fixed_fail": round(fixed["fail"] / runs, 4),
                     "saving": round(n_max / (sent / runs), 2)})
    return rows


def control_cell(runs: int, seed: int, n: int = 30, k: int = 5) -> dict:
    """Control arm with sampled repeats: coverage of the excess flip rate's CI and of the net loss's CI."""
    rng = np.random.default_rng([seed, 5])
    cov_ex = cov_net = cov_up = 0
    f_c, f_v = 0.05, 0.10  # the control flips a record with 5 %, the variant with 10 %, independently
    for _ in range(runs):
        p = rng.uniform(0.1, 0.9, n)
        base, var, con = [], [], []
        for i in range(n):
            for r in range(k):
                b = bool(rng.random() < p[i])
                v = (not b) if rng.random() < f_v else b
                c = (not b) if rng.random() < f_c else b
                key = {"sample_id": str(i), "repeat": r, "status": "ok", "prompt_hash": f"{i}"}
                base.append({**key, "score": float(b)})
                var.append({**key, "score": float(v)})
                con.append({**key, "score": float(c)})
        cmp = noise.control_comparison(base, var, con)
        # E[control right - variant right | p_i] = (f_v - f_c)(2 p_i - 1): a flip turns right into wrong w.p. p_i
        true_ex, true_net = f_v - f_c, float(np.mean([(f_v - f_c) * (2 * x - 1) for x in p]))
        cov_ex += cmp["ci"][0] <= true_ex <= cmp["ci"][1]
        cov_up += true_ex <= cmp["excess_upper"]  # the reading's "97.5 % one-sided bound"
        cov_net += cmp["net_loss_ci"][0] <= true_net <= cmp["net_loss_ci"][1]
    return {"design": f"control arm, questions {n} x {k}", "runs": runs,
            "coverage_excess": round(cov_ex / runs, 4), "coverage_net_loss": round(cov_net / runs, 4),
            "coverage_upper": round(cov_up / runs, 4)}


def table(rows: list[dict]) -> str:
    """The markdown tables docs/statistics.md holds (section 8), from the rows of one run of this script."""
    pct = lambda x: "–" if x is None else f"{100 * x:.1f}"  # noqa: E731

    def mde(m: dict) -> str:
        return "–" if m.get("mde_pts") is None else f"{m['mde_pts']:.2f}: **{pct(m['power'])}** ({pct(m['fresh_power'])})"

    out = ["| design | keep at 90 % (≤ 2.5) | pass at the gate (2.5) | fail at the gate (2.5) | coverage 90 / 95 /"
           " 100 % (95) | pass at 100 % |", "|---|---:|---:|---:|---|---:|"]
    fixed = [r for r in rows if "keep@90" in r]
    for r in fixed:
        out.append(f"| {r['design']} | {pct(r['keep@90'])} | {pct(r['pass@gate'])} | {pct(r['fail@gate'])} |"
                   f" {pct(r['coverage@90'])} / {pct(r['coverage@gate'])} / {pct(r['coverage@100'])} |"
                   f" {pct(r['pass@100'])} |")
    out += ["", "| design | run drawn at 100 %: MDE pts: **power at the stated truth (80 ± 2)** (fresh runs, not"
            " claimed) | run drawn at 90 %: the same |", "|---|---|---|"]
    out += [f"| {r['design']} | {mde(r['mde_power']['100'])} | {mde(r['mde_power']['90'])} |" for r in fixed]
    out += ["", "| pilot (binary: both/lost/gained/neither) | more_samples printed | with the chance printed |"
            " P(decided) simulated |", "|---|---:|---:|---:|"]
    out += [f"| {r['pilot']} | {r['more_samples']} | {pct(r.get('claim'))} | {pct(r.get('p_decided'))} |"
            for r in rows if "pilot" in r]
    seq = [r for r in rows if "truth" in r]
    if seq:
        out += ["", "| design | truth | sequential pass / fail | mean samples sent | all n_max: pass / fail | saving |",
                "|---|---:|---|---:|---|---:|"]
        out += [f"| {r['design']} | {r['truth']:g} | {pct(r['pass'])} / {pct(r['fail'])} | {r['mean_sent']} |"
                f" {pct(r['fixed_pass'])} / {pct(r['fixed_fail'])} | {r['saving']}x |" for r in seq]
    ctl = [r for r in rows if "coverage_excess" in r]
    if ctl:
        out += ["", "| design | coverage of the excess flip CI (95) | of its one-sided upper bound (97.5) |"
                " coverage of the net loss CI (95) |", "|---|---:|---:|---:|"]
        out += [f"| {r['design']} | {pct(r['coverage_excess'])} | {pct(r.get('coverage_upper'))} |"
                f" {pct(r['coverage_net_loss'])} |" for r in ctl]
    return "\n".join(out)


PARTS = {  # --part: which rows a part owns, and how to rerun them (runs, seed)
    "pilots": (lambda r: "pilot" in r,
               lambda runs, seed: [more_samples_cell(n, runs, seed) for n in PILOTS]
               + [clustered_more_cell(n, PILOT_RUNS, seed) for n in CLUSTERED_PILOTS]),
    "sequential": (lambda r: "truth" in r,
                   lambda runs, seed: [r for n in (300, 1326) for r in sequential_cell(runs, seed, n, truths=SEQ_TRUTHS)]),
    "control": (lambda r: "coverage_excess" in r, lambda runs, seed: [control_cell(runs, seed)]),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000, help="simulated runs per cell")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fast", action="store_true", help="the small designs only (the tests' slice)")
    ap.add_argument("--out", default=None, help="write every row as JSON here")
    ap.add_argument("--part", choices=sorted(PARTS), default=None,
                    help="rerun only this part and replace its rows in --out (an existing results file)")
    ap.add_argument("--table", default=None, metavar="JSON", help="print the markdown table of a results file, run nothing")
    args = ap.parse_args(argv)
    if args.table:
        with open(args.table, encoding="utf-8") as f:
            print(table(json.load(f)["rows"]))
        return 0
    t0 = time.time()
    if args.part:
        with open(args.out, encoding="utf-8") as f:
            kept = json.load(f)
        mine, run = PARTS[args.part]
        new = run(args.runs, args.seed)
        kept["rows"] = [r for r in kept["rows"] if not mine(r)] + new
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(kept, f, indent=1)
            f.write("\n")
        print("\n".join(json.dumps(r) for r in new))
        return 0
    rows = []
    for d in (FAST if args.fast else DESIGNS):
        rows.append(fixed_cell(d, args.runs, args.seed))
        print(json.dumps(rows[-1]), flush=True)
    for name in (list(PILOTS)[:1] if args.fast else PILOTS):
        rows.append(more_samples_cell(name, args.runs, args.seed))
        print(json.dumps(rows[-1]), flush=True)
    if not args.fast:
        for name in CLUSTERED_PILOTS:
            rows.append(clustered_more_cell(name, PILOT_RUNS, args.seed))
            print(json.dumps(rows[-1]), flush=True)
        for n_max in (300, 1326):
            for r in sequential_cell(args.runs, args.seed, n_max, truths=SEQ_TRUTHS):
                rows.append(r)
                print(json.dumps(r), flush=True)
        rows.append(control_cell(args.runs, args.seed))
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"runs_per_cell": args.runs, "seed": args.seed, "wall_s": round(time.time() - t0, 1)}))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"runs_per_cell": args.runs, "seed": args.seed, "rows": rows}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
