"""Golden files: frozen records in, expected summary out (values worked out by hand in the JSON)."""

import json
from pathlib import Path

import pytest

from fp8eval.metrics.arm import arm_summary, paired_recovery
from fp8eval.metrics.pairing import PairingError
from fp8eval.records import read_records

GOLDEN = Path(__file__).parent / "data" / "golden"


def test_golden_summary_and_recovery():
    b = read_records(GOLDEN / "baseline.jsonl")
    v = read_records(GOLDEN / "variant.jsonl")
    expected = json.loads((GOLDEN / "expected_summary.json").read_text())
    for name, recs in (("baseline", b), ("variant", v)):
        got = arm_summary(recs)
        for key, value in expected[name].items():
            assert got[key] == pytest.approx(value), (name, key)
    rec = paired_recovery(b, v)
    assert rec["overall"] == pytest.approx(expected["recovery"]["overall"])
    assert rec["by_group"] == pytest.approx(expected["recovery"]["by_group"])
    assert rec["n_pairs"] == expected["recovery"]["n_pairs"]


def test_recovery_refuses_different_prompts():
    b = read_records(GOLDEN / "baseline.jsonl")
    v = read_records(GOLDEN / "variant.jsonl")
    v[0]["prompt_hash"] = "something-else"
    with pytest.raises(PairingError, match="different prompt hashes"):
        paired_recovery(b, v)
