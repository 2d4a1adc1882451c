"""summary.json, the terminal table and the report make their numbers in one place (fp8eval.metrics):
the same records give the same numbers, to the last bit, duplicates and superseded lines included."""

from __future__ import annotations

import json
import math
from pathlib import Path

from conftest import run_inprocess

from fp8eval.metrics.pairing import recovery_of
from fp8eval.metrics.select import one_per_key
from fp8eval.report.analysis import Settings, arm_table, build_pairs, recovery_table
from fp8eval.report.load import load_runs
from fp8eval.table import format_table

RUN = ["engine=fake", "engine.script=needle", "+engine.engine_args.fake_fp8_error=0.4",
       "task.lengths=[1024,2048]", "task.depths=[0,50,100]", "task.repeats=2", "sampling.temperature=0.7",
       "report=false"]


def _tamper(path: Path, other_arm: bool = False) -> None:
    lines = path.read_text().splitlines(keepends=True)
    first, second = json.loads(lines[0]), json.loads(lines[1])
    extra = [lines[0]]  # an exact duplicate line (a crash between two appends)
    flipped = dict(second, score=1.0 - second["score"], completion="later answer")
    extra.append(json.dumps(flipped) + "\n")  # a later good record for the same key: it wins
    if other_arm:
        err = dict(first, status="error", score=None, finish_reason="error", score_details={"error": "x"})
        extra.append(json.dumps(err) + "\n")  # an error after a good record: the good one stays
    path.write_text("".join(lines + extra))


def test_summary_table_and_report_agree_exactly(tmp_path):
    first = run_inprocess(tmp_path, RUN, "a")
    _tamper(Path(first["arms"]["fp8"]["records"]))
    _tamper(Path(first["arms"]["bf16"]["records"]), other_arm=True)
    summary = run_inprocess(tmp_path, RUN, "b")
    assert [a["requests_sent"] for a in summary["arms"].values()] == [0, 0]
    run_dir = tmp_path / "b"
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    (run_dir / ".hydra" / "config.yaml").write_text(
        "model: {name: smollm2-135m}\ntask: {name: niah}\nkv: {name: fp8}\nbaseline: bf16\nseed: 1234\n"
        f"records_dir: {tmp_path / 'records'}\n")

    runs, arms = load_runs([run_dir])
    pairs, refused = build_pairs(runs)
    assert not refused and len(pairs) == 1
    table, _ = recovery_table(pairs, Settings(n_boot=50))
    per_arm = arm_table(arms)

    for kv, arm in summary["arms"].items():
        rows = per_arm[per_arm["kv"] == kv].set_index("group")
        assert rows.loc["all", "score"] == arm["score"]
        assert rows.loc["all", "stderr"] == arm["stderr"]
        assert rows.loc["all", "n"] == arm["n_scored"] == 6 * 2  # 6 cells x 2 repeats
        for group, value in arm["by_group"].items():
            assert rows.loc[group, "score"] == value, group
    rec = table.set_index("group")
    assert rec.loc["all", "recovery_pct"] == summary["recovery"]["overall"]
    for group, value in summary["recovery"]["by_group"].items():
        assert rec.loc[group, "recovery_pct"] == value, group
    assert rec.loc["all", "baseline_score"] == summary["arms"]["bf16"]["score"]
    assert rec.loc["all", "variant_stderr"] == summary["arms"]["fp8"]["stderr"]
    # the verdicts' CI, MDE and counts (issue 22) come from one function too
    ver = summary["verdict"]
    for group, entry in [("all", ver["overall"]), *ver["by_group"].items()]:
        for col, key in [("ci_low", "ci_low"), ("mde_pts", "mde_pts"), ("lost", "lost"), ("gained", "gained"),
                         ("ci_method", "ci_method")]:
            want, got = entry[key], rec.loc[group, col]
            assert (got != got if want is None else got == want), (group, col)  # None in the summary: NaN here
        assert (rec.loc[group, "ci_high"] == entry["ci_high"]) or entry["ci_high"] is None
    # the terminal table prints the same summary
    text = format_table(summary)
    assert f"{summary['recovery']['overall']:.1f}%" in text
    assert f"verdict (gate 95%): {ver['overall']['verdict']}" in text
    # and the later good record won in both paths: the flipped score is what counts
    recs = [json.loads(x) for x in Path(summary["arms"]["fp8"]["records"]).read_text().splitlines()]
    kept, replaced = one_per_key(recs)
    assert replaced == 2 and len(kept) == 12
    scores = [r["score"] for r in kept]
    assert math.isclose(summary["arms"]["fp8"]["score"], sum(scores) / len(scores), rel_tol=0, abs_tol=0)


def test_recovery_of_is_none_for_a_zero_baseline():
    assert recovery_of([(0.0, 1.0)]) is None
    assert recovery_of([]) is None
    assert recovery_of([(1.0, 0.5), (1.0, 1.0)]) == 75.0


def test_report_says_when_a_store_holds_more_than_the_run(tmp_path):
    """A smaller grid reuses a larger grid's store: its summary counts its own keys, the report reads the
    whole store, and the report says so instead of disagreeing silently."""
    from fp8eval.report.build import _store_wider_than_run

    run_inprocess(tmp_path, RUN, "big")
    small = run_inprocess(tmp_path, [a for a in RUN if not a.startswith("task.depths")] + ["task.depths=[0]"], "small")
    run_dir = tmp_path / "small"
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    (run_dir / ".hydra" / "config.yaml").write_text(
        "model: {name: smollm2-135m}\ntask: {name: niah}\nkv: {name: fp8}\nbaseline: bf16\nseed: 1234\n"
        f"records_dir: {tmp_path / 'records'}\n")
    assert small["arms"]["fp8"]["n_records"] == 2 * 2
    runs, _ = load_runs([run_dir])
    notes = _store_wider_than_run(runs)
    assert len(notes) == 2 and "holds 12 records" in notes[0] and "counts 4" in notes[0]
