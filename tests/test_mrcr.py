"""MRCR: official grader, bins, Context Arena AUC, synthetic rows, manifest, skip-not-truncate."""

from __future__ import annotations

import json
import re
from difflib import SequenceMatcher
from pathlib import Path

import pytest

from fp8eval.metrics.auc import MRCR_EDGES, MRCR_LABELS, bucket_of, context_arena_auc
from fp8eval.scoring import mrcr_grade

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
HAYSTACK_DIRS = [REPO / "tasks" / "niah" / "haystack", SHARED / "niah_haystack"]


def _haystack() -> Path:
    for d in HAYSTACK_DIRS:
        if any(d.glob("pg*.txt")):
            return d
    pytest.skip("no haystack books (tasks/niah/haystack or ../shared/data/niah_haystack)")


def _need_o200k():
    from fp8eval.tasks.mrcr.o200k import o200k_encoding

    try:
        return o200k_encoding()
    except RuntimeError as e:
        pytest.skip(f"o200k_base not available offline: {e}")


def quarter_chars(text: str) -> int:
    """A stand-in token counter (~4 chars per token) for tests that must not depend on tiktoken."""
    return len(text) // 4


def quarter_chars_messages(messages: list[dict]) -> int:
    return sum(quarter_chars(m["content"]) for m in messages)


# --- grading -----------------------------------------------------------------------------------
H = "aYooSG8CQg"


def test_grade_requires_the_prefix():
    assert mrcr_grade("the poem text", H + "the poem text", H) == 0.0
    assert mrcr_grade(" " + H + "the poem text", H + "the poem text", H) == 0.0  # no strip
    assert mrcr_grade(H.lower() + "the poem text", H + "the poem text", H) == 0.0  # case matters
    assert mrcr_grade(H + "the poem text", H + "the poem text", H) == 1.0


def test_grade_is_the_ratio_after_removing_the_prefix_from_both():
    # "abcd" vs "abce": 3 matching chars of 8 in total -> 2*3/8
    assert mrcr_grade(H + "abcd", H + "abce", H) == pytest.approx(0.75)
    # the prefix is removed once, from the front only: a second copy stays and counts
    assert mrcr_grade(H + H + "x", H + "x", H) == pytest.approx(2 * 1 / (11 + 1))
    assert isinstance(mrcr_grade(H + "abcd", H + "abce", H), float)


def test_grade_unicode_and_empty():
    assert mrcr_grade(H + "東京🤖 naïve", H + "東京🤖 naïve", H) == 1.0
    assert mrcr_grade(H + "café", H + "cafe", H) == pytest.approx(0.75)
    assert mrcr_grade("", H + "anything", H) == 0.0
    assert mrcr_grade(H, H + "abc", H) == 0.0  # only the hash: nothing matches
    assert mrcr_grade(H, H, H) == 1.0  # difflib: two empty strings are identical


def test_grade_keeps_difflib_defaults_autojunk_on():
    # autojunk treats chars in > 1% of a >= 200-char text as junk; the official rule keeps it on
    answer = "ab" * 150 + "xyz"
    response = "ba" * 150 + "xyz"
    official = SequenceMatcher(None, response, answer).ratio()
    assert official != SequenceMatcher(None, response, answer, autojunk=False).ratio()
    assert mrcr_grade(H + response, H + answer, H) == official


# --- bins and AUC ------------------------------------------------------------------------------
def test_bins_edges_and_labels():
    assert MRCR_LABELS == ("8k", "16k", "32k", "64k", "128k", "256k", "512k", "1M")
    assert MRCR_EDGES[0] == 8192 and MRCR_EDGES[-1] == 1048576
    cases = {4095: None, 4096: "8k", 8192: "8k", 8193: "16k", 16384: "16k", 131072: "128k",
             131073: "256k", 524288: "512k", 524289: "1M", 1048576: "1M", 1048577: None}
    for n, label in cases.items():
        assert bucket_of(n) == label, n


def test_auc_hand_computed():
    assert context_arena_auc({e: 1.0 for e in MRCR_EDGES}, 1048576) == pytest.approx(1.0)
    assert context_arena_auc({8192: 1.0, 16384: 0.5}, 16384) == pytest.approx(0.75)
    s = dict(zip(MRCR_EDGES, [1.0, 0.8, 0.6, 0.4, 0.2]))
    # (1+.8)/2*8192 + (.8+.6)/2*16384 + (.6+.4)/2*32768 + (.4+.2)/2*65536 = 54886.4
    assert context_arena_auc(s, 131072) == pytest.approx(54886.4 / 122880)
    # a 128k model at 1M: the area stops at 128k, the divisor does not
    assert context_arena_auc(s, 1048576) == pytest.approx(54886.4 / 1040384)
    # a perfect 512k model: the 512k-1M segment is about half of AUC@1M
    perfect_512k = {e: 1.0 for e in MRCR_EDGES[:-1]}
    assert context_arena_auc(perfect_512k, 1048576) == pytest.approx(516096 / 1040384)
    # edges above up_to are ignored
    assert context_arena_auc({**s, 262144: 0.0}, 131072) == pytest.approx(54886.4 / 122880)


@pytest.mark.parametrize(
    "scores, up_to",
    [
        ({8192: 1.0, 32768: 1.0}, 32768),  # gap at 16k
        ({16384: 1.0, 32768: 1.0}, 32768),  # no 8k point
        ({8192: 1.0}, 8192),  # zero-width axis
        ({8192: 1.0, 16000: 1.0}, 16384),  # not a bin edge
        ({8192: 1.0, 16384: 1.2}, 16384),  # not a score
        ({8192: 1.0, 16384: 1.0}, 20000),  # up_to not an edge
    ],
)
def test_auc_rejects_malformed_input(scores, up_to):
    with pytest.raises(ValueError):
        context_arena_auc(scores, up_to)


# --- o200k --------------------------------------------------------------------------------------
def test_o200k_is_tiktokens_encoding():
    enc = _need_o200k()
    assert enc.name == "o200k_base" and enc.n_vocab == 200019
    assert enc.encode("hello world") == [24912, 2375]
    from fp8eval.tasks.mrcr.o200k import count_message_tokens

    msgs = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "東京🤖"}]
    assert count_message_tokens(msgs) == 2 + len(enc.encode("東京🤖"))


# --- synthetic rows -----------------------------------------------------------------------------
COLUMNS = {"prompt", "answer", "random_string_to_prepend", "n_needles", "desired_msg_index",
           "total_messages", "n_chars", "date_added", "synthetic"}
ASK = re.compile(
    r"^Prepend (\w{10}) to the (\d+)(?:st|nd|rd|th) \(1 indexed\) (.+) about (.+)\. "
    r"Do not include any other text in your response\.$"
)


def _synth(bins, needles, rows, seed=0):
    from fp8eval.tasks.mrcr.synth import synth_rows

    return list(synth_rows(bins, needles, rows, seed=seed, haystack_dir=_haystack(),
                           count_tokens=quarter_chars))


def test_synthetic_rows_schema_and_structure():
    rows = _synth(["8k", "32k"], [2, 4, 8], 1)
    assert len(rows) == 6
    for row in rows:
        assert set(row) == COLUMNS
        assert row["synthetic"] is True and row["date_added"] == "synthetic"
        messages = json.loads(row["prompt"])
        assert [m["role"] for m in messages] == ["user", "assistant"] * (len(messages) // 2) + ["user"]
        assert messages[0]["content"].startswith(
            "Here are some examples of conversations succeeded by a follow-up question answered correctly:"
        )
        assert "======EXAMPLE======" in messages[0]["content"]
        m = ASK.match(messages[-1]["content"])
        assert m, messages[-1]["content"]
        hash_, k, form, topic = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        assert hash_ == row["random_string_to_prepend"]
        assert 1 <= k <= row["n_needles"]
        needle_ask = f"write a {form} about {topic}"
        asks = [i for i, msg in enumerate(messages[:-1])
                if msg["role"] == "user" and msg["content"].endswith("\n\n" + needle_ask)
                or msg["content"] == needle_ask]
        assert len(asks) == row["n_needles"]
        assert row["desired_msg_index"] == asks[k - 1] + 1
        assert messages[row["desired_msg_index"]]["role"] == "assistant"
        assert row["answer"] == hash_ + messages[row["desired_msg_index"]]["content"]
        assert row["total_messages"] == len(messages)
        assert row["n_chars"] == sum(len(msg["content"]) for msg in messages)


def test_synthetic_rows_are_deterministic():
    a = _synth(["8k", "16k"], [2], 2, seed=7)
    b = _synth(["8k", "16k"], [2], 2, seed=7)
    c = _synth(["8k", "16k"], [2], 2, seed=8)
    assert a == b
    assert [r["prompt"] for r in a] != [r["prompt"] for r in c]
    assert len({r["prompt"] for r in a}) == 4


def test_synthetic_rows_land_in_their_bins():
    rows = _synth(["8k", "16k", "64k", "256k"], [2], 1)
    got = [bucket_of(quarter_chars_messages(json.loads(r["prompt"]))) for r in rows]
    assert got == ["8k", "16k", "64k", "256k"]


def test_synthetic_rows_land_in_their_bins_by_o200k():
    _need_o200k()
    from fp8eval.tasks.mrcr.o200k import count_message_tokens
    from fp8eval.tasks.mrcr.synth import synth_rows

    rows = list(synth_rows(["8k", "128k", "1M"], [8], 1, seed=3, haystack_dir=_haystack()))
    assert [bucket_of(count_message_tokens(json.loads(r["prompt"]))) for r in rows] == ["8k", "128k", "1M"]


def test_synthetic_rejects_unknown_bin():
    with pytest.raises(ValueError, match="valid"):
        _synth(["2M"], [2], 1)


# --- manifest -----------------------------------------------------------------------------------
def _write(rows, path: Path) -> Path:
    from fp8eval.tasks.mrcr.synth import write_jsonl

    return write_jsonl(rows, path)


def test_manifest_is_built_once_and_reused(tmp_path):
    from fp8eval.tasks.mrcr.data import load_or_build_manifest

    data = _write(_synth(["8k", "16k"], [2, 4], 1), tmp_path / "rows.jsonl")
    calls = []

    def counter(messages):
        calls.append(1)
        return quarter_chars_messages(messages)

    refs, path, built = load_or_build_manifest([data], {"k": 1}, tmp_path / "m", counter=counter)
    assert built and path.is_file() and len(calls) == 4
    assert [r.bucket for r in refs] == ["8k", "16k", "8k", "16k"]
    assert [r.n_needles for r in refs] == [2, 2, 4, 4]
    refs2, path2, built2 = load_or_build_manifest([data], {"k": 1}, tmp_path / "m", counter=counter)
    assert not built2 and path2 == path and refs2 == refs and len(calls) == 4
    # another data key (a new revision, changed files) is another manifest
    _, path3, built3 = load_or_build_manifest([data], {"k": 2}, tmp_path / "m", counter=counter)
    assert built3 and path3 != path and len(calls) == 8


def test_manifest_parallel_matches_serial_o200k(tmp_path):
    _need_o200k()
    from fp8eval.tasks.mrcr.data import measure_files
    from fp8eval.tasks.mrcr.o200k import count_message_tokens

    data = _write(_synth(["8k", "32k"], [2], 3), tmp_path / "rows.jsonl")
    parallel = measure_files([data], workers=2)
    serial = measure_files([data], counter=count_message_tokens)
    assert parallel == serial and len(parallel) == 6
    assert all(r.bucket == bucket_of(r.n_tokens) for r in parallel)


def test_row_reader_reads_back_each_row(tmp_path):
    from fp8eval.tasks.mrcr.data import RowReader, measure_files

    rows = _synth(["8k"], [2], 3)
    data = _write(rows, tmp_path / "rows.jsonl")
    refs = measure_files([data], counter=quarter_chars_messages)
    reader = RowReader([data])
    assert [reader.read(r) for r in reversed(refs)] == list(reversed(rows))


def test_missing_columns_fail_with_the_schema(tmp_path):
    from fp8eval.tasks.mrcr.data import measure_files

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "[]", "answer": "x"}) + "\n")
    with pytest.raises(ValueError, match="random_string_to_prepend"):
        measure_files([bad], counter=quarter_chars_messages)


# --- the task: fit rule, groups, scoring, summary -------------------------------------------------
def _task(tmp_path, count_tokens, max_model_len, **cfg_kw):
    from fp8eval.tasks.base import TaskContext
    from fp8eval.tasks.mrcr import MrcrConfig, MrcrTask

    cfg = MrcrConfig(manifest_dir=str(tmp_path / "cache"), workers=1, **cfg_kw)
    ctx = TaskContext(count_tokens=count_tokens, max_model_len=max_model_len, model_name="t", seed=0)
    return MrcrTask(cfg, ctx)


def _prompt_tokens(prompt) -> int:
    return quarter_chars_messages(list(prompt.messages)) + 20  # + template overhead


def test_task_skips_rows_that_do_not_fit_and_never_truncates(tmp_path):
    _need_o200k()
    from fp8eval.tasks.base import SkipSample

    rows = _synth(["8k", "32k"], [2], 1)
    data = _write(rows, tmp_path / "rows.jsonl")
    task = _task(tmp_path, _prompt_tokens, 16384, data_files=[str(data)],
                 sampling=_sampling(1000))
    samples = task.samples()
    assert [s.groups for s in samples] == [("8k",), ("32k",)]
    small, big = samples
    p = task.prompt(small, 0)
    assert list(p.messages) == json.loads(rows[0]["prompt"])  # the whole conversation, untouched
    assert task.prompt(small, 3) is p
    with pytest.raises(SkipSample, match="does not fit"):
        task.prompt(big, 0)


def _sampling(max_tokens):
    from fp8eval.config import SamplingConfig

    return SamplingConfig(max_tokens=max_tokens)


def test_fit_boundary_counts_max_tokens(tmp_path):
    _need_o200k()
    from fp8eval.tasks.base import SkipSample

    data = _write(_synth(["8k"], [2], 1), tmp_path / "rows.jsonl")
    fits = _task(tmp_path, lambda p: 7000, 8000, data_files=[str(data)], sampling=_sampling(1000))
    assert fits.prompt(fits.samples()[0], 0).messages
    over = _task(tmp_path, lambda p: 7001, 8000, data_files=[str(data)], sampling=_sampling(1000))
    with pytest.raises(SkipSample, match="7001 tokens \\+ max_tokens 1000 > max_model_len 8000"):
        over.prompt(over.samples()[0], 0)


def test_prefilter_skips_huge_rows_without_counting_them(tmp_path):
    _need_o200k()
    from fp8eval.tasks.base import SkipSample

    data = _write(_synth(["64k"], [2], 1), tmp_path / "rows.jsonl")

    def never(prompt):
        raise AssertionError("a row 4x over budget must not be tokenised")

    task = _task(tmp_path, never, 8192, data_files=[str(data)], sampling=_sampling(1000))
    with pytest.raises(SkipSample, match="o200k tokens is over 4x"):
        task.prompt(task.samples()[0], 0)


def test_task_scores_with_the_official_rule_and_groups_by_needles(tmp_path):
    _need_o200k()
    rows = _synth(["8k"], [2, 4], 1)
    data = _write(rows, tmp_path / "rows.jsonl")
    task = _task(tmp_path, _prompt_tokens, 65536, data_files=[str(data)], needles=[2, 4])
    samples = task.samples()
    assert [s.groups for s in samples] == [("8k", "2needle", "2needle/8k"), ("8k", "4needle", "4needle/8k")]
    for sample, row in zip(samples, rows):
        assert task.score(sample, row["answer"]).value == 1.0
        assert task.score(sample, row["answer"][10:]).value == 0.0
        assert task.score(sample, "").value == 0.0


def test_task_selects_needles_and_buckets(tmp_path):
    _need_o200k()
    data = _write(_synth(["8k", "16k", "32k"], [2, 4], 1), tmp_path / "rows.jsonl")
    task = _task(tmp_path, _prompt_tokens, 65536, data_files=[str(data)], needles=[4], max_bucket="16k")
    assert [(s.data["n_needles"], s.groups) for s in task.samples()] == [(4, ("8k",)), (4, ("16k",))]
    task = _task(tmp_path, _prompt_tokens, 65536, data_files=[str(data)], buckets=["32k"])
    assert [s.groups for s in task.samples()] == [("32k",)]


def test_task_config_errors_name_the_valid_choices(tmp_path):
    with pytest.raises(ValueError, match=r"\[2, 4, 8\]"):
        _task(tmp_path, _prompt_tokens, 8192, needles=[3])
    with pytest.raises(ValueError, match="valid"):
        _task(tmp_path, _prompt_tokens, 8192, max_bucket="2M")


def test_synthetic_task_labels_itself(tmp_path):
    _need_o200k()
    _haystack()
    task = _task(tmp_path, _prompt_tokens, 65536, synthetic=True, synthetic_rows=1, max_bucket="16k")
    samples = task.samples()
    assert [s.groups for s in samples] == [("8k",), ("16k",)]
    assert all(s.data["synthetic"] and s.data["date_added"] == "synthetic" for s in samples)
    assert any("SYNTHETIC" in line for line in task.notes())
    assert task.fingerprint()["data"]["synthetic"]["rows_per_bin"] == 1


def _rec(bucket, repeat, score, status="ok"):
    return {"groups": [bucket], "repeat": repeat, "score": score if status == "ok" else None,
            "status": status}


def test_summary_per_bucket_means_and_auc():
    from fp8eval.tasks.mrcr.task import summarize_records

    records = [
        _rec("8k", 0, 1.0), _rec("8k", 1, 0.8),
        _rec("16k", 0, 0.6), _rec("16k", 1, 0.6),
        _rec("32k", 0, 0.4), _rec("32k", 1, 0.2),
        _rec("64k", 0, None, "skipped"), _rec("64k", 1, None, "skipped"),
    ]
    out = summarize_records(records, [2], synthetic=False)
    b = out["buckets"]
    assert b["8k"]["score"] == pytest.approx(0.9) and b["16k"]["score"] == pytest.approx(0.6)
    assert b["32k"]["score"] == pytest.approx(0.3) and b["64k"]["score"] is None
    assert b["64k"]["n_skipped"] == 2 and b["8k"]["n_scored"] == 2
    # stderr over the two repeat means: 8k repeats are 1.0 and 0.8 -> sd 0.1414, / sqrt 2 = 0.1
    assert b["8k"]["stderr"] == pytest.approx(0.1)
    assert out["auc_up_to"] == "32k"
    area = (0.9 + 0.6) / 2 * 8192 + (0.6 + 0.3) / 2 * 16384
    assert out["auc"] == pytest.approx(area / (32768 - 8192))
    assert out["auc_1m"] == pytest.approx(area / (1048576 - 8192))


def test_summary_only_8k_has_no_model_auc():
    from fp8eval.tasks.mrcr.task import summarize_records

    out = summarize_records([_rec("8k", 0, 1.0), _rec("16k", 0, None, "skipped")], [2], False)
    assert out["auc"] is None and out["auc_up_to"] == "8k" and "two edges" in out["auc_note"]
    assert out["auc_1m"] == 0.0


def test_parquet_rows_stream_and_read_back(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from fp8eval.tasks.mrcr.data import RowReader, measure_files

    # the hub shards' columns (no `synthetic`), several row groups
    rows = [{k: v for k, v in r.items() if k != "synthetic"} for r in _synth(["8k", "16k"], [2], 3)]
    path = tmp_path / "2needle_0.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=4)
    assert pq.ParquetFile(path).num_row_groups == 2
    refs = measure_files([path], counter=quarter_chars_messages)
    assert [r.loc for r in refs] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]
    assert not any(r.synthetic for r in refs)
    reader = RowReader([path])
    assert [reader.read(r) for r in refs] == rows
    assert reader.read(refs[1]) == rows[1]  # back into an earlier group


def test_real_format_rows_note_the_december_fix(tmp_path):
    _need_o200k()
    rows = _synth(["8k"], [2], 3)
    for row, date in zip(rows, ["04-12-2025", "12-05-2025", "04-12-2025"]):
        row["date_added"] = date
        del row["synthetic"]  # as in the hub shards
    data = _write(rows, tmp_path / "rows.jsonl")
    task = _task(tmp_path, _prompt_tokens, 65536, data_files=[str(data)])
    assert not any(s.data["synthetic"] for s in task.samples())
    assert any("3 MRCR rows selected; 1 of them were regenerated" in line for line in task.notes())
    assert not any("SYNTHETIC" in line for line in task.notes())


def test_oracle_answers_every_synthetic_row_exactly():
    from fp8eval.tasks.mrcr.synth import oracle_answer

    for row in _synth(["8k", "16k"], [2, 4, 8], 2, seed=5):
        messages = json.loads(row["prompt"])
        assert oracle_answer(messages) == row["answer"]
        assert mrcr_grade(oracle_answer(messages), row["answer"], row["random_string_to_prepend"]) == 1.0


# --- end to end through the Hydra app ---------------------------------------------------------------
def _run_app(tmp_path: Path, *overrides: str, timeout: int = 600) -> dict:
    import os
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "fp8eval", "task=mrcr", "task.synthetic=true",
            f"task.manifest_dir={tmp_path / 'cache'}", f"records_dir={tmp_path / 'records'}",
            f"hydra.run.dir={run_dir}", "progress=false", "report=false", *overrides]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == str(run_dir)
    assert "SYNTHETIC" in res.stdout
    return json.loads((run_dir / "summary.json").read_text())


def test_end_to_end_fake_engine_both_arms(tmp_path):
    _need_o200k()
    _haystack()
    summary = _run_app(
        tmp_path, "engine=fake", "engine.script=fp8eval.tasks.mrcr.synth:fake_engine_oracle",
        "+engine.engine_args.fake_fp8_error=0.5", "model.max_model_len=40000",
        "task.synthetic_rows=2", "task.max_bucket=64k", "task.repeats=2",
    )
    assert set(summary["arms"]) == {"bf16", "fp8"}
    base, var = summary["arms"]["bf16"], summary["arms"]["fp8"]
    # 8k-32k rows fit 40000 - 4096; the 64k rows (> 32k o200k tokens) are recorded as skipped
    assert {"8k", "16k", "32k"} <= set(base["by_group"]) and "64k" not in base["by_group"]
    assert base["buckets"]["64k"]["n_skipped"] == 4 and base["buckets"]["64k"]["score"] is None
    assert all(base["by_group"][b] == 1.0 for b in ("8k", "16k", "32k"))  # the oracle is perfect
    assert base["auc_up_to"] == "32k" and base["auc"] == pytest.approx(1.0)
    assert base["auc_1m"] == pytest.approx((32768 - 8192) / (1048576 - 8192))
    assert base["synthetic"] is True
    assert 0.0 <= var["auc"] < 1.0  # the fake fp8 arm loses some answers
    assert summary["recovery"]["auc"] == pytest.approx(100 * var["auc"] / base["auc"])
    assert summary["recovery"]["auc_1m"] == pytest.approx(100 * var["auc_1m"] / base["auc_1m"])
    assert summary["recovery"]["by_group"]["8k"] is not None


@pytest.mark.slow
def test_end_to_end_embedded_model_reference_engine(tmp_path):
    _need_o200k()
    _haystack()
    # SmolLM2-135M has 8k context: only the 8k bin can fit once max_tokens is small. Seed 24 makes
    # the smallest 8k row of seeds 0-39 (4,851 o200k tokens): the CPU prefill is the slow part.
    summary = _run_app(
        tmp_path, "engine=reference", "task.synthetic_rows=1", "task.synthetic_seed=24",
        "task.max_bucket=16k", "task.repeats=2", "task.sampling.max_tokens=16", "sampling.temperature=0.6",
        timeout=2400,
    )
    assert set(summary["arms"]) == {"bf16", "fp8"}
    for arm in summary["arms"].values():
        assert set(arm["by_group"]) == {"8k"}
        assert arm["buckets"]["16k"]["n_skipped"] == 2 and arm["buckets"]["8k"]["n_scored"] == 2
        assert 0.0 <= arm["by_group"]["8k"] <= 1.0
        assert arm["auc"] is None and arm["auc_up_to"] == "8k"  # one edge: no model AUC
        assert arm["auc_1m"] == 0.0
    assert "recovery" in summary and "auc_1m" in summary["recovery"]


def test_niah_128k_preset_caps_at_the_models_context(tmp_path):
    import os
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "fp8eval", "task=niah_128k", "engine=fake", f"hydra.run.dir={run_dir}",
            f"records_dir={tmp_path / 'records'}", "progress=false", "report=false"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    arm = summary["arms"]["fp8"]
    # SmolLM2's 8k context: lengths 1k, 2k, 4k and the capped 8192 - 32; 11 depths x 4 needles each
    assert {g for g in arm["by_group"] if g.startswith("ctx=")} == {"ctx=1024", "ctx=2048", "ctx=4096", "ctx=8160"}
    assert len([g for g in arm["by_group"] if g.startswith("depth=")]) == 11
    assert arm["n_samples"] == 4 * 11 * 4
    assert any("grid stops at 8160" in n for n in summary["notes"])
