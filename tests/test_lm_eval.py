"""task=lm_eval: lm-eval's tasks through fp8eval's engines, paired, and scored exactly as lm-eval scores them.

The data are invented (tests/data/lm_eval/): a custom generate_until task, a custom multiple_choice task,
a group of both, and lm-eval's shipped gsm8k pointed at a six-problem local JSONL.
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import pytest
from conftest import REPO, run_inprocess

pytest.importorskip("lm_eval")

DATA = REPO / "tests" / "data" / "lm_eval"
GSM8K_LOCAL = {"task": "gsm8k", "num_fewshot": 2, "dataset_path": "json", "dataset_name": None,
               "dataset_kwargs": {"data_files": {"train": str(DATA / "gsm8k_sample.jsonl"),
                                                 "test": str(DATA / "gsm8k_sample.jsonl")}}}
GSM8K_OVERRIDE = ("{task: gsm8k, num_fewshot: 2, dataset_path: json, dataset_name: null, dataset_kwargs: "
                  f"{{data_files: {{train: '{DATA / 'gsm8k_sample.jsonl'}', test: '{DATA / 'gsm8k_sample.jsonl'}'}}}}}}")
BASE = ["task=lm_eval", "engine=fake", "model=smollm2-135m", "task.offline=true", "report=false",
        f"task.include_path={DATA}"]


def _unit(*parts: str) -> float:
    return int.from_bytes(hashlib.sha256("\x00".join(parts).encode()).digest()[:8], "big") / 2**64


def oracle_text(context: str) -> str:
    """A deterministic model: right on some questions, wrong on others, with the answer in various shapes."""
    m = list(re.finditer(r"What is (\d+) plus (\d+)\?", context))
    if m:
        a, b = int(m[-1].group(1)), int(m[-1].group(2))
        return f" {a + b if (a + b) % 3 else a + b + 1}"
    q = context.rsplit("Question:", 1)[-1]
    nums = [int(x) for x in re.findall(r"\d+", q)]
    guess = nums[0] * nums[1] if len(nums) > 1 and _unit(q) < 0.6 else sum(nums)
    return f" Let me think: the result is {guess}.\n#### {guess}" if _unit(q, "fmt") < 0.5 else f" It is {guess}."


def oracle_pair(context: str, continuation: str) -> tuple[float, bool]:
    return (-20.0 * _unit(context, continuation), _unit(continuation) < 0.3)


def oracle(req, i):
    """engine.script for the fake engine: the same answers the scripted lm-eval LM gives."""
    if req.logprob_pairs:
        return [oracle_pair(c, x) for c, x in req.logprob_pairs]
    return oracle_text(req.prompt_text)


def test_custom_and_shipped_tasks_both_arms(tmp_path):
    summary = run_inprocess(tmp_path, BASE + [
        f"task.tasks=[fp8eval_toy,{GSM8K_OVERRIDE}]", "engine.script=test_lm_eval:oracle", "kv=fp8",
        "+engine.engine_args.fake_fp8_error=0.3"])
    base, var = summary["arms"]["bf16"], summary["arms"]["fp8"]
    assert base["n_records"] == var["n_records"] == 5 + 4 + 6
    assert base["n_errors"] == base["n_skipped"] == 0
    assert {"task=fp8eval_sums", "task=fp8eval_colours", "task=gsm8k", "group=fp8eval_toy",
            "max_length=4096", "max_length=8192"} <= set(base["by_group"])
    assert summary["recovery"]["overall"] is not None and "task=gsm8k" in summary["recovery"]["by_group"]
    # every metric under every filter, aggregated as lm-eval aggregates them
    assert set(base["lm_eval"]["gsm8k"]) == {"exact_match,strict-match", "exact_match,flexible-extract"}
    assert set(base["lm_eval"]["fp8eval_colours"]) == {"acc,none", "acc_norm,none"}
    # a rerun is resumed from the records: nothing is sent again
    again = run_inprocess(tmp_path, BASE + [
        f"task.tasks=[fp8eval_toy,{GSM8K_OVERRIDE}]", "engine.script=test_lm_eval:oracle", "kv=fp8",
        "+engine.engine_args.fake_fp8_error=0.3"], name="again")
    assert again["arms"]["fp8"]["requests_sent"] == 0 and again["recovery"] == summary["recovery"]


def test_exact_agreement_with_lm_eval(tmp_path):
    """For the same completions and loglikelihoods, lm-eval's own simple_evaluate (with a scripted LM) and
    fp8eval give the same per-document metrics and the same aggregate, to the last bit."""
    from lm_eval import simple_evaluate
    from lm_eval.api.model import LM
    from lm_eval.tasks import TaskManager

    from fp8eval.records import read_records
    from fp8eval.tasks.lm_eval.bridge import _with_overrides

    class Scripted(LM):
        def loglikelihood(self, requests):
            return [oracle_pair(*r.args[:2]) for r in requests]

        def generate_until(self, requests):
            return [oracle_text(r.args[0]) for r in requests]

        def loglikelihood_rolling(self, requests):
            raise NotImplementedError

    summary = run_inprocess(tmp_path, BASE + [
        f"task.tasks=[fp8eval_toy,{GSM8K_OVERRIDE}]", "engine.script=test_lm_eval:oracle", "kv=bf16", "baseline=none"])
    ours = summary["arms"]["bf16"]["lm_eval"]
    records = {r["sample_id"]: r for r in read_records(Path(summary["arms"]["bf16"]["records"]))}

    tm = TaskManager(include_path=str(DATA))
    theirs = simple_evaluate(model=Scripted(), tasks=["fp8eval_toy", _with_overrides(tm, GSM8K_LOCAL)],
                             task_manager=tm, bootstrap_iters=0, log_samples=True)
    for task, metrics in ours.items():
        for key, value in metrics.items():
            assert theirs["results"][task][key] == value, (task, key)
        for s in theirs["samples"][task]:
            details = records[f"{task}:{s['doc_id']}"]["score_details"]["metrics"]
            for key in metrics:
                if key.endswith("," + s["filter"]):
                    assert s[key.split(",")[0]] == details[key], (task, s["doc_id"], key)
    assert ours["gsm8k"]["exact_match,flexible-extract"] != ours["gsm8k"]["exact_match,strict-match"]
    # the GPU script's comparison (scripts/gpu/lm_eval_compare.py), on these CPU results
    from scripts.gpu.lm_eval_compare import compare

    report = compare(summary, "bf16", theirs)["tasks"]
    assert {t: (r["docs_same_metric"], r["docs_different_metric"], r["max_loglikelihood_abs_diff"])
            for t, r in report.items()} == {"fp8eval_sums": (5, 0, 0.0), "fp8eval_colours": (4, 0, 0.0),
                                            "gsm8k": (6, 0, 0.0)}


def test_hub_task_offline_fails_at_once():
    from fp8eval.tasks.lm_eval.bridge import LmEvalError, load

    t0 = time.perf_counter()
    with pytest.raises(LmEvalError, match="dataset_path: json"):
        load(["gsm8k"], None, {}, offline=True)
    assert time.perf_counter() - t0 < 60  # the index scan, not the hub's retries
    with pytest.raises(LmEvalError, match="no task, group or tag 'gsm8kk'"):
        load(["gsm8kk"], None, {}, offline=True)


def test_engine_without_loglikelihood_refuses():
    from fp8eval.engines.base import EngineBase, EngineError, Request
    from fp8eval.engines.loglikelihood import send

    class GenerateOnly(EngineBase):  # the default capabilities: generation alone
        kind = "generate-only"

        def generate(self, requests):
            return iter(())

    req = Request(id="r", messages=(), n=1, seeds=(0,), sampling={}, logprob_pairs=(("Q:", " A"),))
    with pytest.raises(EngineError, match="cannot score loglikelihood requests"):
        list(send(GenerateOnly(), [req]))


def test_encode_pair_follows_lm_eval():
    from fp8eval.engines.loglikelihood import encode_pair

    def enc(text):  # one token per word, with its leading space (a BPE-like split)
        return [hash(w) % 1000 for w in re.findall(r" ?\S+| +$", text)]

    ctx, cont = encode_pair(enc, "Answer: ", "blue", 7)
    assert ctx == enc("Answer:") and cont == enc(" blue")  # the context's trailing space moves over
    assert encode_pair(enc, "", "blue sky", 7) == ([7], enc("blue sky"))  # empty context: the prefix token


def test_metric_choice_and_sampling():
    from fp8eval.tasks.lm_eval.bridge import LmEvalError
    from fp8eval.tasks.lm_eval.scoring import sampling_from

    assert sampling_from({"until": ["Q:"], "do_sample": False, "max_gen_toks": 16}) == {
        "stop": ["Q:"], "max_tokens": 16, "temperature": 0.0}
    with pytest.raises(LmEvalError, match="no fp8eval sampling equivalent"):
        sampling_from({"until": [], "num_beams": 4})


@pytest.mark.slow
def test_reference_engine_smollm2(tmp_path):
    """Both arms on the embedded SmolLM2 with the reference engine: generation and loglikelihood."""
    pytest.importorskip("torch")
    summary = run_inprocess(tmp_path, BASE[:1] + BASE[2:] + [
        "engine=reference", "kv=fp8", "task.tasks=[fp8eval_toy]", "task.limit=2"])
    from fp8eval.records import read_records

    for arm in ("bf16", "fp8"):
        a = summary["arms"][arm]
        assert a["n_records"] == 4 and a["n_errors"] == 0
        recs = read_records(Path(a["records"]))
        lls = [r for r in recs if r["sample_id"].startswith("fp8eval_colours")]
        assert all(r["completion"].startswith("[[-") for r in lls)
    assert summary["recovery"]["overall"] is not None
