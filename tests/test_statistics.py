"""The statistics behind verdicts against textbook values (docs/statistics.md)."""

import math

import pytest

from fp8eval.metrics import intervals, power
from fp8eval.metrics.verdict import GateSettings, decide, entry, verdicts


# --- quantiles: normal and Student t tables ---------------------------------------------------------
@pytest.mark.parametrize("p, z", [(0.975, 1.959964), (0.95, 1.644854), (0.8, 0.841621), (0.995, 2.575829)])
def test_normal_quantiles(p, z):
    assert intervals.z_quantile(p) == pytest.approx(z, abs=1e-6)


@pytest.mark.parametrize("p, df, t", [(0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 8, 2.3060),
                                      (0.975, 29, 2.0452), (0.95, 3, 2.3534), (0.995, 10, 3.1693),
                                      (0.975, 1000, 1.9623)])
def test_t_quantiles_match_the_table(p, df, t):
    assert intervals.t_quantile(p, df) == pytest.approx(t, abs=1e-4)
    assert intervals.t_quantile(1 - p, df) == pytest.approx(-t, abs=1e-4)


def test_wilson_interval():
    # Newcombe 1998 (single proportion) example 81/263, Wilson score without CC: 0.2553 to 0.3662
    lo, hi = intervals.wilson(81, 263, intervals.z_quantile(0.975))
    assert (lo, hi) == (pytest.approx(0.2553, abs=1e-4), pytest.approx(0.3662, abs=1e-4))


# --- paired 2x2 tables: Fagerland, Lydersen & Laake (2017) ch. 8, Cavo et al. (2012) -----------------
def test_newcombe_square_and_add_paired_difference():
    # table [[59, 6], [16, 80]]: estimate -0.0621 (95% CI -0.1186 to -0.0046)
    est, lo, hi = intervals.newcombe_paired_diff(both=59, gained=6, lost=16, neither=80)
    assert (est, lo, hi) == (pytest.approx(-0.0621, abs=1e-4), pytest.approx(-0.1186, abs=1e-4),
                             pytest.approx(-0.0046, abs=1e-4))


def test_bonett_price_ratio_of_paired_proportions():
    # same table, ratio 0.8667 (95% CI 0.7579 to 0.9910)
    est, lo, hi = intervals.bonett_price_ratio(both=59, gained=6, lost=16)
    assert (est, lo, hi) == (pytest.approx(0.8667, abs=1e-4), pytest.approx(0.7579, abs=1e-4),
                             pytest.approx(0.9910, abs=1e-4))


def test_nine_pairs_without_a_flip_are_not_a_certainty():
    """The default run's shape: 7 right in both, 2 wrong in both. The bootstrap said 100-100 %."""
    pairs = [(str(i), 1.0, 1.0) for i in range(7)] + [(str(i), 0.0, 0.0) for i in range(7, 9)]
    ci = intervals.recovery_ci(pairs)
    assert ci.method == "bonett-price" and ci.point == 100.0
    # Bonett-Price alone: 76.41 %; the exact one-way-loss bound 0.025^(1/7) = 59.04 % is lower (issue 36)
    assert intervals.bonett_price_ratio(7, 0, 0)[1] == pytest.approx(0.7641, abs=1e-4)
    assert ci.low == pytest.approx(100 * 0.025 ** (1 / 7), abs=0.01) and ci.high > 100
    e = entry([(c, b, v) for c, b, v in pairs], GateSettings())
    assert e["verdict"] == "inconclusive"
    assert e["more_samples"] and e["more_samples"] > 9 and "more samples" in e["why"]
    assert e["mde_pts"] > 30


def test_clustered_interval_with_no_flip_has_width_and_shrinks_with_data():
    few = [(str(i % 5), 0.8, 0.8) for i in range(20)]
    many = [(str(i % 500), 0.8, 0.8) for i in range(2000)]
    a, b = intervals.recovery_ci(few), intervals.recovery_ci(many)
    assert a.method == b.method == "fieller-clustered"
    assert a.low < 100 < a.high
    assert b.low > a.low and b.high < a.high and b.low > 99


def test_fieller_matches_a_ratio_delta_method_for_large_n():
    """With many clusters Fieller tends to the delta-method CI of a ratio of means."""
    import random

    rng = random.Random(0)
    pairs = []
    for i in range(4000):
        p = rng.random()
        pairs += [(str(i), float(rng.random() < p), float(rng.random() < p * 0.9)) for _ in range(2)]
    ci = intervals.recovery_ci(pairs)
    m = intervals.cluster_moments(pairs)
    r = (m.mb + m.md) / m.mb
    var_u = m.sdd - 2 * (r - 1) * m.sdb + (r - 1) ** 2 * m.sbb
    se = math.sqrt(var_u / m.n) / m.mb
    assert ci.low / 100 == pytest.approx(r - 1.96 * se, abs=3e-3)
    assert ci.high / 100 == pytest.approx(r + 1.96 * se, abs=3e-3)


def test_decide_against_the_gate():
    assert decide(96.0, 104.0, 95.0) == "pass"
    assert decide(80.0, 94.9, 95.0) == "fail"
    assert decide(90.0, 101.0, 95.0) == "inconclusive"
    assert decide(None, None, 95.0) == "n/a"


def test_a_big_clean_run_passes_and_a_big_drop_fails():
    keep = [(str(i), 1.0, 1.0) for i in range(900)] + [(str(i), 0.0, 0.0) for i in range(900, 1000)]
    assert entry(keep, GateSettings())["verdict"] == "pass"
    drop = [(str(i), 1.0, float(i % 5 != 0)) for i in range(1000)]  # 20 % lost
    out = entry(drop, GateSettings())
    assert out["verdict"] == "fail" and out["lost"] == 200


def test_verdicts_block_has_every_group():
    pairs = [(str(i), (f"ctx={i % 2}",), 1.0, 1.0) for i in range(10)]
    out = verdicts(pairs, GateSettings(gate=90))
    assert set(out["by_group"]) == {"ctx=0", "ctx=1"}
    assert out["settings"]["gate"] == 90 and out["settings"]["level"] == pytest.approx(0.95)


def test_gate_settings_refuse_nonsense():
    with pytest.raises(ValueError, match="alpha"):
        verdicts([], GateSettings(alpha=1.5))


# --- power: Miller 2024's formula, the issue's MDEs, TensorRT-LLM's thresholds ------------------------
@pytest.mark.parametrize("n, k, pq, mde_pts", [(30, 10, 0.10, 7.2), (198, 5, 0.12, 4.4), (500, 5, 0.04, 1.6),
                                               (175, 10, 0.10, 3.0)])
def test_mde_of_the_reasoning_suite(n, k, pq, mde_pts):
    """AIME25 x10, GPQA-D x5, MATH500 x5, LCB v6 x10 with independent arms (sigma2_w = 2 E[p(1-p)])."""
    var = power.Variance(0.0, 2 * pq, "prior", binary=False)
    assert 100 * power.mde(var, n, k) == pytest.approx(mde_pts, abs=0.05)


def test_clusters_and_repeats_needed_invert_the_mde():
    var = power.Variance(0.0, 0.2, "prior", binary=False)
    assert power.repeats_needed(var, 0.01, 30) == 524  # 1 point on AIME25 (30 questions)
    n = power.clusters_needed(var, 0.05, 4)
    assert power.mde(var, n, 4) <= 0.05 < power.mde(var, n - 1, 4)
    assert power.repeats_needed(power.Variance(0.01, 0.2, "p", False), 0.01, 30) is None


def test_flip_floor_makes_small_binary_runs_honest():
    var = power.Variance(0.0, 0.0, "no flip seen", binary=True)
    # one-way flips: delta = z^2 (1 - delta) / n  ->  delta = z^2 / (n + z^2)
    z2 = power.z_sum(0.05, 0.8) ** 2
    assert power.mde(var, 9, 1) == pytest.approx(z2 / (9 + z2), abs=1e-6)


def test_trtllm_thresholds():
    # TensorRT-LLM accuracy tests: n = 4096, sigma = 50, alpha 0.05, beta 0.2 -> theta 2.747, gamma = ref - 1.82
    theta, gamma = power.trtllm_threshold(4096)
    assert theta == pytest.approx(2.747, abs=1e-3) and gamma == pytest.approx(-1.817, abs=1e-3)


def test_variance_from_pilot_pairs():
    pairs = [("a", 1.0, 1.0), ("a", 1.0, 0.0), ("b", 0.0, 0.0), ("b", 0.0, 0.0)]
    v = power.variance_from_pairs(pairs, "pilot")
    assert v.sigma2_w == pytest.approx(0.25)  # cluster a: diffs 0, -1 -> var 0.5; b: 0 -> mean 0.25
    assert v.omega2 == pytest.approx(0.0)  # means -0.5, 0 -> var 0.125 = 0.25 / 2
    with pytest.raises(ValueError, match="2 clusters"):
        power.variance_from_pairs(pairs[:2], "pilot")


def test_difference_ci_is_the_excess_over_a_control():
    # 20 samples: control and variant agree except 3 the variant lost: -15 points, CI below 0 not required
    pairs = [(str(i), 1.0, 0.0 if i < 3 else 1.0) for i in range(20)]
    est, lo, hi = intervals.difference_ci(pairs)
    assert est == pytest.approx(-15.0) and lo < est < hi
    e2, l2, h2 = intervals.newcombe_paired_diff(both=17, gained=0, lost=3, neither=0)
    assert (lo, hi) == (pytest.approx(100 * l2), pytest.approx(100 * h2))


@pytest.mark.parametrize("effect, n", [(0.5, 32), (0.25, 126), (1.0, 8)])
def test_sample_size_table_of_a_one_sample_z_test(effect, n):
    """The textbook normal-approximation table (two-sided alpha 0.05, power 0.8): n = 7.849 / effect^2, rounded
    up (e.g. Chow, Shao & Wang, "Sample Size Calculations in Clinical Research", one-sample mean)."""
    var = power.Variance(1.0, 0.0, "table", binary=False)
    assert power.clusters_needed(var, effect, 1) == n
