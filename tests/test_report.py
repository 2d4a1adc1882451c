"""The recovery report: golden CSV, statistics, verdicts, refusal to pair mismatched arms, the CLI."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fp8eval.metrics import stats
from fp8eval.metrics.auc import context_arena_auc
from fp8eval.metrics.pairing import PairingError
from fp8eval.report import write_report
from fp8eval.report.analysis import pair_arms
from fp8eval.report.load import Arm, Record, ReportInputError
from fp8eval.report.verdicts import Thresholds, bucket_sign_test, gate_verdict

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "report"
GOLDEN = DATA / "golden"


def _fixtures_module():
    spec = importlib.util.spec_from_file_location("report_fixtures", DATA / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture()
def golden_copy(tmp_path) -> Path:
    dst = tmp_path / "project"
    shutil.copytree(GOLDEN, dst)
    return dst


@pytest.fixture(scope="module")
def golden_report(tmp_path_factory) -> Path:
    return write_report([GOLDEN], tmp_path_factory.mktemp("golden_report"))


def _records_file(root: Path, kv: str) -> Path:
    summary = json.loads(next(root.rglob("summary.json")).read_text())
    return root / summary["arms"][kv]["records"]


# --- golden --------------------------------------------------------------------------------------
def test_golden_recovery_csv_matches_frozen_expectation(golden_report):
    got = pd.read_csv(golden_report / "recovery.csv")
    want = pd.read_csv(GOLDEN / "expected_recovery.csv")
    assert list(got.columns) == list(want.columns)
    pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-9, atol=1e-6)


def test_golden_numbers_by_hand(golden_report):
    """The golden file itself, checked against numbers worked out from GOLDEN in make_fixtures.py:
    paired scored records are s1×2, s2×2, s3×2, s4×2 and s6 repeat 0 (s5 skipped in both arms, s6
    repeat 1 an error in fp8): baseline 7/9, variant 5/9, recovery 5/7."""
    t = pd.read_csv(golden_report / "recovery.csv").set_index("group")
    for col in ["model", "task", "baseline", "variant", "group", "baseline_score", "variant_score",
                "recovery_pct", "ci_low", "ci_high", "n"]:
        assert col == "group" or col in t.columns
    a = t.loc["all"]
    assert (a["model"], a["task"], a["baseline"], a["variant"]) == ("fixture-model-a", "toy", "bf16", "fp8")
    assert a["baseline_score"] == pytest.approx(7 / 9, abs=1e-6)
    assert a["variant_score"] == pytest.approx(5 / 9, abs=1e-6)
    assert a["recovery_pct"] == pytest.approx(100 * 5 / 7, abs=1e-6)
    assert (a["n"], a["n_samples"], a["n_repeats"], a["n_excluded"]) == (9, 5, 2, 3)
    # one cut-off completion per arm among the 9 paired records
    assert a["baseline_cutoff_rate"] == pytest.approx(1 / 9, abs=1e-6)
    assert a["variant_cutoff_rate"] == pytest.approx(1 / 9, abs=1e-6)
    # the paired bootstrap, kept beside the CI: every sample has variant <= baseline, so no resample
    # can exceed 100 %
    assert a["boot_high"] == pytest.approx(100.0) and a["boot_low"] < a["recovery_pct"]
    easy, hard = t.loc["level=easy"], t.loc["level=hard"]
    assert (easy["recovery_pct"], easy["boot_low"], easy["boot_high"]) == (100.0, 100.0, 100.0)
    assert hard["recovery_pct"] == pytest.approx(100 / 3, abs=1e-6)
    # two samples s3 (2 vs 1) and s4 (1 vs 0): resamples give 0 %, 33 % or 50 % with probs 1/4, 1/2, 1/4
    assert (hard["boot_low"], hard["boot_high"]) == (0.0, 50.0)
    # The verdicts' CI (issue 22): 5 samples x 2 repeats are clusters, so Fieller with the one-flip floor;
    # it is never narrower than the bootstrap here, and 2-3 samples decide nothing (the bootstrap said
    # pass on 3 samples without a flip and fail on 2).
    assert set(t["ci_method"]) == {"fieller-clustered"}
    assert (t["ci_low"] <= t["boot_low"]).all() and (t["ci_high"] >= t["boot_high"]).all()
    assert (a["lost"], a["gained"], a["n_clusters"]) == (2, 0, 5)
    assert (hard["verdict"], easy["verdict"], a["verdict"]) == ("inconclusive",) * 3
    assert a["more_samples"] > 0


def test_golden_flips_reference_their_records(golden_report):
    flips = pd.read_csv(golden_report / "flips.csv")
    assert [(r.direction, r.sample_id, r.repeat) for r in flips.itertuples()] == [("lost", "s3", 0), ("lost", "s4", 1)]
    for r in flips.itertuples():
        for col in ("baseline_record", "variant_record"):
            path, _, line = getattr(r, col).rpartition(":")
            assert not Path(path).is_absolute()  # relative to the report: a copied report still finds it
            rec = json.loads((golden_report / path).read_text().splitlines()[int(line) - 1])
            assert (rec["sample_id"], rec["repeat"]) == (r.sample_id, r.repeat)
            side = "baseline" if col.startswith("baseline") else "variant"
            assert getattr(r, f"{side}_completion") == rec["completion"]  # both completions, shown side by side


def test_report_points_at_nothing_of_this_machine(golden_copy):
    """Every path a report writes is relative to it: copied with its runs elsewhere, it names no old folder."""
    out = write_report([golden_copy], golden_copy / "report", n_boot=200, cache=False)
    moved = golden_copy.parent / "moved"
    shutil.copytree(golden_copy, moved)
    for path in (moved / "report").rglob("*"):
        if path.suffix in (".md", ".html", ".csv", ".json"):
            assert str(golden_copy) not in path.read_text(encoding="utf-8"), path
    md = (moved / "report" / "report.md").read_text(encoding="utf-8")
    assert "## Inputs\n\n- `../outputs/2026-01-01/10-00-00`" in md and out == (golden_copy / "report").resolve()
    arms = pd.read_csv(moved / "report" / "arms.csv")
    assert all((moved / "report" / p).is_file() for p in arms["records"])


def test_first_figure_is_recovery_with_its_ci(golden_report):
    md = (golden_report / "report.md").read_text()
    figures = [line for line in md.splitlines() if line.startswith("![")]
    assert figures[0].startswith("![Recovery with its 95% CI against the gate](figures/recovery_ci.png)"), figures
    page = (golden_report / "index.html").read_text()
    assert page.index('alt="Recovery with its 95% CI against the gate"') < page.index('alt="Recovery heatmap"')
    assert "_" not in "".join(re.findall(r'<th data-col="[^"]*">([^<]*)</th>', page))  # readable headers


def test_report_md_explains_each_verdict(golden_report):
    md = (golden_report / "report.md").read_text()
    assert "## Decision" in md and "### Why" in md
    assert "recovery 71.4% (95% CI" in md and "**inconclusive**" in md and "more samples" in md
    assert "2 lost" not in md  # counts are in a table, not prose
    assert "| fixture-model-a | toy | bf16 | fp8 | 2 | 0 |" in md


def test_index_html_is_self_contained(golden_report):
    page = (golden_report / "index.html").read_text()
    assert "http://" not in page and "https://" not in page
    assert page.count('src="data:image/png;base64,') == len(list((golden_report / "figures").glob("*.png")))
    assert "Content-Security-Policy" in page and 'class="sortable"' in page


def test_figures_written_as_png_and_svg(golden_report):
    pngs = {p.stem for p in (golden_report / "figures").glob("*.png")}
    svgs = {p.stem for p in (golden_report / "figures").glob("*.svg")}
    assert pngs == svgs and "recovery_heatmap" in pngs


# --- CLI -------------------------------------------------------------------------------------------
def _cli(*args, cwd=REPO):
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "fp8eval.report", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_default_out_and_last_line(golden_copy):
    res = _cli(golden_copy, "--n-boot", "200")
    assert res.returncode == 0, res.stderr
    last = res.stdout.strip().splitlines()[-1]
    assert Path(last) == (golden_copy / "report").resolve()
    assert (Path(last) / "recovery.csv").is_file() and (Path(last) / "index.html").is_file()


def test_cli_gate_is_configurable(golden_copy, tmp_path):
    res = _cli(golden_copy, "--out", tmp_path / "r", "--gate", "30", "--unsure-margin", "100")
    assert res.returncode == 0, res.stderr
    t = pd.read_csv(tmp_path / "r" / "recovery.csv").set_index("group")
    assert t.loc["all", "verdict"] == "pass"


def test_identity_comes_from_config_not_folder_names(golden_copy, tmp_path):
    run = next(golden_copy.rglob("summary.json")).parent
    run.rename(run.parent / "bf16-llama-70b-gpqa")  # a misleading folder name changes nothing
    out = write_report([golden_copy], tmp_path / "r", n_boot=200)
    t = pd.read_csv(out / "recovery.csv")
    assert set(t["model"]) == {"fixture-model-a"} and set(t["task"]) == {"toy"}


def test_summary_contradicting_config_is_an_error(golden_copy, tmp_path):
    path = next(golden_copy.rglob("summary.json"))
    s = json.loads(path.read_text())
    s["model"] = "another-model"
    path.write_text(json.dumps(s))
    with pytest.raises(ReportInputError, match="another-model"):
        write_report([golden_copy], tmp_path / "r", n_boot=50)


# --- refusal to pair -------------------------------------------------------------------------------
def _rewrite_record(path: Path, sample_id: str, repeat: int, **changes) -> None:
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if rec["sample_id"] == sample_id and rec["repeat"] == repeat:
            rec.update(changes)
            lines[i] = json.dumps(rec, sort_keys=True)
    path.write_text("\n".join(lines) + "\n")


def test_refuses_to_pair_mismatched_prompt_hashes(golden_copy, tmp_path):
    _rewrite_record(_records_file(golden_copy, "fp8"), "s2", 1, prompt_hash="0" * 64)
    with pytest.raises(PairingError, match=r"1 of \d+ \(sample, repeat\) pairs have different prompt hashes.*s2#1"):
        write_report([golden_copy], tmp_path / "r", n_boot=50)
    res = _cli(golden_copy, "--out", tmp_path / "cli")
    assert res.returncode == 2
    assert "refusing to pair" in res.stderr and "prompt hashes" in res.stderr
    assert not (tmp_path / "cli" / "recovery.csv").exists()
    # On request the pair is left out and listed instead of stopping the report.
    res = _cli(golden_copy, "--out", tmp_path / "skip", "--skip-mismatched")
    assert res.returncode == 0, res.stderr
    assert "Refused pairs" in (tmp_path / "skip" / "report.md").read_text()
    assert len(pd.read_csv(tmp_path / "skip" / "recovery.csv")) == 0


def test_refuses_to_pair_different_task_versions(golden_copy, tmp_path):
    path = _records_file(golden_copy, "fp8")
    path.write_text(path.read_text().replace('"task_version":"1"', '"task_version":"2"'))
    with pytest.raises(PairingError, match="task_version"):
        write_report([golden_copy], tmp_path / "r", n_boot=50)


# --- statistics ------------------------------------------------------------------------------------
def test_bootstrap_ci_coverage_by_simulation():
    """200 simulated paired datasets with a known true recovery of 95 %: the 95 % percentile CI must
    cover it in 90-99 % of them (binomial sd of the coverage at n=200 is 1.5 points). With 1000
    datasets of this design the coverage measured 94-95 %; a 90 % or an unpaired CI falls outside."""
    true_recovery = 95.0
    covered = 0
    n_sims, n_samples, repeats = 200, 300, 4
    for sim in range(n_sims):
        rng = np.random.default_rng(10_000 + sim)
        q = rng.beta(2.0, 1.5, size=n_samples)  # per-sample difficulty, shared by both arms
        u = rng.random((n_samples, repeats))  # common random numbers: the paired design
        base = (u < q[:, None]).sum(axis=1).astype(float)
        var = (u < 0.95 * q[:, None]).sum(axis=1).astype(float)
        ci = stats.paired_bootstrap_recovery(base, var, n_boot=1000, seed=sim)
        covered += ci.low <= true_recovery <= ci.high
    coverage = covered / n_sims
    assert 0.90 <= coverage <= 0.99, coverage


def test_bootstrap_is_deterministic_and_degenerate_cases():
    b, v = [2, 1, 2, 1, 1], [2, 1, 1, 0, 1]
    one = stats.paired_bootstrap_recovery(b, v, n_boot=300, seed=3)
    two = stats.paired_bootstrap_recovery(b, v, n_boot=300, seed=3)
    assert one == two and one.low <= one.point <= one.high
    same = stats.paired_bootstrap_recovery([1, 0, 2], [1, 0, 2], n_boot=100)
    assert (same.point, same.low, same.high) == (100.0, 100.0, 100.0)
    zero = stats.paired_bootstrap_recovery([0, 0], [1, 0], n_boot=50)
    assert math.isnan(zero.point) and math.isnan(zero.low)
    with pytest.raises(ValueError):
        stats.paired_bootstrap_recovery([1, 2], [1], n_boot=10)


def test_stratified_bootstrap_keeps_strata_sizes():
    def ratio(bm, vm):
        if sum(bm.values()) == 0:
            raise ZeroDivisionError
        return 100 * sum(vm.values()) / sum(bm.values())

    # stratum "a": variant equals baseline; stratum "b": variant half of it. Each stratum keeps its own
    # samples, so the statistic can never leave [50 %, 100 %] however the samples are drawn.
    ci = stats.stratified_paired_bootstrap([1, 2, 1, 2], [1, 2, 0.5, 1], [1, 1, 1, 1], ["a", "a", "b", "b"],
                                           ratio, n_boot=300, seed=1)
    assert ci.point == pytest.approx(75.0) and 50.0 <= ci.low <= ci.point <= ci.high <= 100.0
    undefined = stats.stratified_paired_bootstrap([0, 0], [1, 1], [1, 1], ["a", "b"], ratio, n_boot=10)
    assert math.isnan(undefined.point)


def test_sign_test_exact_values():
    assert stats.sign_test(5, 0) == 1 / 32
    assert stats.sign_test(7, 1) == 9 / 256
    assert stats.sign_test(6, 2) == 37 / 256
    assert stats.sign_test(0, 0) == 1.0
    assert stats.sign_test(0, 4) == 1.0
    assert stats.sign_test_two_sided(7, 1) == 18 / 256
    assert stats.min_units_for_sign_test(0.05) == 5


def test_stderr_rule_across_repeats_or_samples():
    # two repeats: means 0.8 and 0.75 -> std 0.03536 / sqrt(2)
    assert stats.stderr_of_scores(["a", "b", "a", "b"], [0, 0, 1, 1], [1, 0.6, 1, 0.5]) == pytest.approx(0.025)
    assert stats.stderr_of_scores(["a", "b", "c"], [0, 0, 0], [1, 0, 1]) == pytest.approx(math.sqrt(1 / 3) / math.sqrt(3))


def test_context_arena_auc_by_hand():
    assert context_arena_auc({8192: 1.0, 16384: 0.5}, 16384) == pytest.approx(0.75)
    # past the last scored edge the area is zero but the divisor stays
    assert context_arena_auc({8192: 1.0, 16384: 0.5}, 32768) == pytest.approx(6144 / 24576)


# --- verdicts --------------------------------------------------------------------------------------
def test_gate_verdict_rules():
    th = Thresholds(gate=95.0, unsure_margin=2.0)
    assert gate_verdict(97.0, 93.5, 100.0, th)[0] == "pass"
    assert gate_verdict(97.0, 92.0, 100.0, th)[0] == "inconclusive"
    assert gate_verdict(93.0, 90.0, 96.0, th)[0] == "inconclusive"
    assert gate_verdict(97.0, 94.0, 100.0, Thresholds())[0] == "inconclusive"  # no margin by default
    assert gate_verdict(97.0, 95.0, 100.0, Thresholds())[0] == "pass"
    assert gate_verdict(90.0, 85.0, 94.9, th)[0] == "fail"
    assert gate_verdict(math.nan, math.nan, math.nan, th)[0] == "n/a"


def _arm(kv: str, scores: dict[tuple[str, int], tuple[str, float]]) -> Arm:
    recs = []
    for i, ((sid, rep), (bucket, score)) in enumerate(sorted(scores.items()), start=1):
        recs.append(Record({"sample_id": sid, "repeat": rep, "groups": [bucket], "status": "ok",
                            "score": score, "task_version": "1", "prompt_hash": f"h-{sid}-{rep}",
                            "finish_reason": "stop", "extracted": None}, i))
    return Arm("m", "mrcr", kv, kv * 8, Path(f"/x/{kv}.jsonl"), recs, {}, [Path("/x")], kv)


def _bucket_data(shift_sign) -> tuple[Arm, Arm]:
    """8 buckets × 10 samples × 2 repeats. The variant differs from the baseline on exactly one record
    per bucket, by 0.2 in the direction shift_sign(bucket): a small gap, inside each bucket's band."""
    rng = np.random.default_rng(1)
    base, var = {}, {}
    for bi, bucket in enumerate(["8k", "16k", "32k", "64k", "128k", "256k", "512k", "1M"]):
        for j in range(10):
            for rep in range(2):
                key = (f"{bucket}-{j}", rep)
                s = float(np.round(rng.uniform(0.3, 0.9), 3))
                base[key] = (bucket, s)
                var[key] = (bucket, s + (0.2 * shift_sign(bi) if (j, rep) == (0, 0) else 0.0))
    return _arm("bf16", base), _arm("fp8", var)


def test_sign_test_flags_systematic_downward_shift():
    th = Thresholds()
    b, v = _bucket_data(lambda i: -1)
    st = bucket_sign_test(pair_arms(b, v), th)
    assert (st.n_below, st.n_above, st.n_ties) == (8, 0, 0)
    assert st.p_value == 1 / 256 and st.shift
    assert st.n_below_outside_band == 0  # every gap alone is inside its band: only the test sees it
    assert "no margin" in st.explain()  # issue 36: the sign test is reported, the CI-based verdicts decide


def test_sign_test_does_not_flag_balanced_differences():
    b, v = _bucket_data(lambda i: -1 if i % 2 else 1)
    st = bucket_sign_test(pair_arms(b, v), Thresholds())
    assert (st.n_below, st.n_above) == (4, 4) and not st.shift


def test_calibration_recommended_in_report(tmp_path):
    """End to end: a shift in all 8 MRCR buckets, overall recovery above the gate. Issue 36: the sign test has no
    margin, so a 1-point drop whose CI does not exclude drops under the 1-point margin is 'keep', with the shift
    reported beside; a margin of 0.1 points makes it 'calibrate' only if the CI excludes such drops."""
    fx = _fixtures_module()
    root = tmp_path / "proj"
    b, v = _bucket_data(lambda i: -1)
    fps = {"bf16": "b" * 64, "fp8": "f" * 64}
    arms = {}
    for kv, arm in (("bf16", b), ("fp8", v)):
        arms[kv] = [fx.record(fps[kv], kv, "mrcr", "1", r.data["sample_id"], r.data["repeat"], 1,
                              r.data["groups"], "ok", r.data["score"]) for r in arm.records]
    fx.write_run(root, "09-00-00", "m", "mrcr", "1", "fp8", 2, 1, arms, fps, {})
    out = write_report([root], tmp_path / "r", n_boot=300)
    verdicts = json.loads((out / "verdicts.json").read_text())
    assert [d["decision"] for d in verdicts["decisions"]] == ["keep"]
    assert verdicts["headline"][0]["verdict"] == "pass"
    assert "systematic downward shift" in (out / "report.md").read_text()
    assert "no reason to calibrate" in verdicts["decisions"][0]["text"]


def test_shared_baseline_is_loaded_once_and_auc_rows(tmp_path):
    fx = _fixtures_module()
    fx.demo_mrcr(tmp_path / "demo", "12-00-00", "fixture-model-b", 262144, {"fp8": 0.93, "fp8_skip2": 0.99})
    fx.demo_niah(tmp_path / "demo", "11-10-00", "fixture-model-a", 0.45)
    out = write_report([tmp_path / "demo"], tmp_path / "r", n_boot=200)
    t = pd.read_csv(out / "recovery.csv")
    mrcr_b = t[(t["model"] == "fixture-model-b") & (t["task"] == "mrcr")]
    assert set(mrcr_b["variant"]) == {"fp8", "fp8_skip2"} and set(mrcr_b["baseline"]) == {"bf16"}
    assert len(set(mrcr_b["baseline_arm"])) == 1  # one bf16 arm serves both variants
    auc = mrcr_b[mrcr_b["metric"] == "auc"].set_index(["variant", "group"])
    summary_paths = list((tmp_path / "demo").rglob("summary.json"))
    arms = {}
    for p in summary_paths:
        s = json.loads(p.read_text())
        if s["model"] == "fixture-model-b" and s["task"] == "mrcr":
            arms.update(s["arms"])
    for var in ("fp8", "fp8_skip2"):
        for key in ("auc", "auc_1m"):
            row = auc.loc[(var, key)]
            assert row["recovery_pct"] == pytest.approx(100 * arms[var][key] / arms["bf16"][key], abs=1e-4)
            assert row["ci_low"] <= row["recovery_pct"] <= row["ci_high"]
    # needle heatmaps come from the records' ctx= / depth= groups
    assert (out / "figures" / "needle_fixture-model-a_niah.png").is_file()
    assert (out / "figures" / "buckets_fixture-model-b_mrcr.svg").is_file()
