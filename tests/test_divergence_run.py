"""`python -m fp8eval.divergence` on the reference engine with the embedded SmolLM2 (tiny lengths)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from fp8eval.divergence.__main__ import register  # noqa: E402
from fp8eval.divergence.run import run  # noqa: E402
from fp8eval.engines.base import EngineBase  # noqa: E402
from fp8eval.engines.vllm.args import OFFLINE_CAPABILITIES  # noqa: E402


def _cfg(tmp_path, *overrides):
    from conftest import REPO
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    register()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="divergence", overrides=[
            f"records_dir={tmp_path / 'records'}", "divergence.lengths=[96]", "divergence.plot=false",
            "engine.threads=2", *overrides])
    return OmegaConf.to_object(cfg)


@pytest.mark.slow
def test_bf16_is_zero_e5m2_diverges_more_than_e4m3_and_reruns_are_free(tmp_path):
    try:
        same = run(_cfg(tmp_path, "kv=bf16"), tmp_path / "same", out=lambda s: None)
    except Exception as e:  # noqa: BLE001 - the embedded model is part of the install; say so if absent
        pytest.skip(f"embedded model unavailable: {e}")
    assert same["overall"]["kl_mean"] == 0 and same["overall"]["top1_agree"] == 1.0
    assert same["overall"]["n_tokens"] == 95 and same["method"] == "exact_full_vocabulary"
    e4m3 = run(_cfg(tmp_path, "kv=fp8"), tmp_path / "e4m3", out=lambda s: None)
    e5m2 = run(_cfg(tmp_path, "kv=fp8_e5m2"), tmp_path / "e5m2", out=lambda s: None)
    assert 0 < e4m3["overall"]["kl_mean"] < e5m2["overall"]["kl_mean"]
    assert e4m3["overall"]["dlogp_mean"] < e5m2["overall"]["dlogp_mean"]
    assert set(e4m3["buckets"]) == {"0-256"} and e4m3["buckets"]["0-256"]["n_tokens"] == 95
    assert e4m3["topk_view"]["overall"]["n_tokens"] == 95 and e4m3["topk_view"]["topk"] == 20
    written = json.loads((tmp_path / "e4m3" / "divergence.json").read_text())
    assert set(written) >= {"model", "kv", "baseline", "engine", "buckets", "overall"}
    assert set(written["buckets"]["0-256"]) == {"kl_mean", "top1_agree", "dlogp_mean", "n_tokens"}
    # the bf16 arm was kept from the first run; a rerun computes nothing and gives the same numbers
    assert e4m3["arms"]["bf16"]["passages_computed"] == 0
    again = run(_cfg(tmp_path, "kv=fp8"), tmp_path / "again", out=lambda s: None)
    assert all(a["passages_computed"] == 0 for a in again["arms"].values())
    assert again["overall"] == e4m3["overall"]
    # another emulation mode is another arm (another fingerprint); the default is fa3_fp8
    kv_only = run(_cfg(tmp_path, "kv=fp8", "kv.attention=kv_only"), tmp_path / "kv_only", out=lambda s: None)
    assert kv_only["arms"]["fp8"]["fingerprint"] != e4m3["arms"]["fp8"]["fingerprint"]
    assert kv_only["overall"]["kl_mean"] != e4m3["overall"]["kl_mean"]


class _FakeTok:
    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1] + [ord(c) % 50 for c in text]}


class _FakeVLLM(EngineBase):
    """Answers prompt_logprobs like the vLLM engine: top-k of a position-seeded distribution; the fp8 arm
    perturbs it."""

    kind = "vllm"
    capabilities = OFFLINE_CAPABILITIES
    calls = 0

    def __init__(self, cfg, kv, shared=None, kind=None):
        self.kv = kv
        self.preflight = {"cache_dtype": kv.engine_args.get("kv_cache_dtype", "auto")}

    def describe(self):
        return {"kind": "vllm", "preflight": self.preflight}

    def _rows(self, ids, k, decode=False):
        import numpy as np

        _FakeVLLM.calls += 1
        rng = np.random.default_rng(0)
        logits = rng.normal(size=(len(ids) - 1, 50)) * 2
        if self.kv.name != "bf16":
            logits = logits + np.random.default_rng(1).normal(size=logits.shape) * 0.3
        if decode:  # the decode kernel sums in another order: a small gap, larger with the FP8 cache
            logits = logits + np.random.default_rng(2).normal(size=logits.shape) * (0.01 if self.kv.name == "bf16" else 0.1)
        lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        top = np.argsort(-lp, -1)[:, :k]
        own = lp[np.arange(len(ids) - 1), np.asarray(ids[1:])]
        return top.tolist(), np.take_along_axis(lp, top, -1).tolist(), own.tolist()

    def prompt_logprobs_many(self, batch, k):
        return [self._rows(ids, k) for ids in batch]

    def decode_logprobs_many(self, batch, k):
        return [self._rows(ids, k, decode=True) for ids in batch]

    def close(self):
        pass


def test_topk_path_with_a_vllm_like_engine(tmp_path, monkeypatch):
    import fp8eval.divergence.run as R

    monkeypatch.setattr(R, "load_tokenizer", lambda model: _FakeTok())
    import fp8eval.arms as A

    monkeypatch.setattr(A, "build_engine", _FakeVLLM)  # every wing opens its engines through fp8eval.arms
    monkeypatch.setattr(R, "resolve_kind", lambda cfg: "vllm")
    cfg = _cfg(tmp_path, "kv=fp8", "engine=vllm", "divergence.lengths=[300]", "divergence.topk=5",
               "divergence.plot=true")
    res = run(cfg, tmp_path / "run", out=lambda s: None)
    assert res["method"] == "topk_shared_renormalised" and res["topk"] == 5 and "renormalised" in res["approximation"]
    assert list(res["buckets"]) == ["0-256", "256-1k"] and res["overall"]["n_tokens"] == 299
    assert 0 < res["overall"]["kl_mean"] and 0 < res["overall"]["top1_agree"] < 1
    assert 0 < res["topk_shared_mean"] <= 5
    assert (tmp_path / "run" / "divergence.png").stat().st_size > 0
    calls = _FakeVLLM.calls
    run(cfg, tmp_path / "again", out=lambda s: None)
    assert _FakeVLLM.calls == calls  # resumed from the kept top-k
    assert "overall" in R.format_table(res)


def test_vllm_worker_prompt_logprobs_parsing(monkeypatch):
    """The worker's prompt_logprobs op against a stand-in vLLM: the first position (None) is dropped and each
    position keeps its k most likely tokens, even when the prompt token ranks below k."""
    import types
    from dataclasses import dataclass

    from fp8eval.engines.vllm import prompt_ops

    @dataclass
    class Lp:
        logprob: float
        rank: int

    from conftest import fake_vllm

    fake_vllm(monkeypatch)

    class LLM:
        def generate(self, prompts, params, use_tqdm=False):
            assert params["prompt_logprobs"] == 2 and params["max_tokens"] == 1
            plp = [None, {7: Lp(-0.1, 1), 8: Lp(-2.0, 2), 3: Lp(-9.0, 40)}, {9: Lp(-0.5, 1), 4: Lp(-1.0, 2)}]
            return [types.SimpleNamespace(prompt_logprobs=plp)]

    (ids, lps, own), = prompt_ops.prompt_logprobs(LLM(), [[1, 3, 4]], 2)
    assert ids == [[7, 8], [9, 4]] and lps == [[-0.1, -2.0], [-0.5, -1.0]]
    assert own == [-9.0, -1.0]  # each prompt token's own log-prob, also below the top k (the path gap reads it)


def test_bf16_control_arm_is_not_collapsed_into_its_baseline(tmp_path, monkeypatch):
    """kv=bf16 with other engine args is a control arm: measured against the plain bf16 baseline (two arms,
    two fingerprints), not compared with itself (which printed 0); kv=bf16 alone stays one arm."""
    import fp8eval.arms as A
    import fp8eval.divergence.run as R

    monkeypatch.setattr(R, "load_tokenizer", lambda model: _FakeTok())
    monkeypatch.setattr(A, "build_engine", _FakeVLLM)
    monkeypatch.setattr(R, "resolve_kind", lambda cfg: "vllm")
    same = run(_cfg(tmp_path, "kv=bf16", "engine=vllm", "divergence.topk=5"), tmp_path / "same", out=lambda s: None)
    assert list(same["arms"]) == ["bf16"] and same["overall"]["kl_mean"] == 0
    control = run(_cfg(tmp_path, "kv=bf16", "engine=vllm", "divergence.topk=5", "++kv.engine_args.enforce_eager=true"),
                  tmp_path / "control", out=lambda s: None)
    assert control["baseline"] == "bf16" and control["kv"] == "bf16-variant"
    assert set(control["arms"]) == {"bf16", "bf16-variant"}
    assert control["arms"]["bf16"]["fingerprint"] == same["arms"]["bf16"]["fingerprint"]
    assert control["arms"]["bf16-variant"]["fingerprint"] != same["arms"]["bf16"]["fingerprint"]
    assert control["overall"]["kl_mean"] > 0  # the stand-in perturbs every arm but the one named bf16


def test_both_paths_give_each_paths_kl_and_the_path_gap(tmp_path, monkeypatch):
    """divergence.path=both with a vLLM-like engine: the decode path's numbers at the top level, both paths' KL per
    bucket, each arm's |decode - prefill| gap of the passage's own token (the BF16 floor below the FP8 arm's); each path
    is its own cache, and a prefill-only run reuses the prefill results."""
    import fp8eval.arms as A
    import fp8eval.divergence.run as R

    monkeypatch.setattr(R, "load_tokenizer", lambda model: _FakeTok())
    monkeypatch.setattr(A, "build_engine", _FakeVLLM)
    monkeypatch.setattr(R, "resolve_kind", lambda cfg: "vllm")
    args = ("kv=fp8", "engine=vllm", "divergence.lengths=[300]", "divergence.topk=5")
    both = run(_cfg(tmp_path, *args, "divergence.path=both"), tmp_path / "both", out=lambda s: None)
    assert both["path"] == "both" and both["kernel_path"] == "decode" and set(both["paths"]) == {"decode", "prefill"}
    assert both["buckets"] == both["paths"]["decode"]["buckets"] != both["paths"]["prefill"]["buckets"]
    gap = both["path_gap"]
    assert set(gap) == {"bf16", "fp8"} and gap["fp8"]["overall"]["n_tokens"] == 299
    assert 0 < gap["bf16"]["overall"]["mean_abs"] < gap["fp8"]["overall"]["mean_abs"]
    assert 0 < gap["fp8"]["overall"]["share_above_1e-3"] <= 1 and gap["fp8"]["overall"]["max_abs"] > 0
    fp8 = both["arms"]["fp8"]
    assert fp8["path"] == "decode" and fp8["other_path"]["path"] == "prefill"
    assert fp8["fingerprint"] != fp8["other_path"]["fingerprint"]
    table = R.format_table(both)
    assert "path gap" in table and "prefill path" in table
    only = run(_cfg(tmp_path, *args, "divergence.path=prefill"), tmp_path / "prefill", out=lambda s: None)
    assert only["arms"]["fp8"]["passages_computed"] == 0 and only["arms"]["fp8"]["fingerprint"] == fp8["other_path"]["fingerprint"]
    assert only["buckets"] == both["paths"]["prefill"]["buckets"] and "path_gap" not in only
    with pytest.raises(ValueError, match="divergence.path='sideways'; valid: prefill, decode, both"):
        run(_cfg(tmp_path, *args, "divergence.path=sideways"), tmp_path / "bad", out=lambda s: None)


def test_decode_fingerprints_and_the_forcing_processor_args(tmp_path):
    """The decode path enters the fingerprint; the forcing logits processor the decode path registers on vLLM stays
    out of a prefill result's fingerprint (it changes nothing a prefill computes), and engine_cfg adds it only for a
    run that reads the decode path (the engine's capabilities name it)."""
    import fp8eval.divergence.run as R
    from fp8eval.engines.vllm.args import OFFLINE_CAPABILITIES
    from fp8eval.engines.vllm.forced import FQCN

    assert OFFLINE_CAPABILITIES.decode_logits_processor == FQCN

    class Eng(EngineBase):
        kind, capabilities = "vllm", OFFLINE_CAPABILITIES

        def __init__(self, args):
            self.args = args

        def describe(self):
            return {"kind": "vllm", "engine_args": dict(self.args)}

    cfg = _cfg(tmp_path, "kv=fp8", "engine=vllm")
    arm = cfg.kv
    plain = Eng({"enforce_eager": True})
    forced = Eng({"enforce_eager": True, "logits_processors": [FQCN], "async_scheduling": False})
    assert R.arm_fingerprint(cfg, plain, arm, "topk")[0] == R.arm_fingerprint(cfg, forced, arm, "topk")[0]
    assert R.arm_fingerprint(cfg, forced, arm, "topk", path="decode")[0] != R.arm_fingerprint(cfg, forced, arm, "topk")[0]
    for path, want in (("prefill", None), ("decode", [FQCN]), ("both", [FQCN])):
        c = _cfg(tmp_path, "kv=fp8", "engine=vllm", f"divergence.path={path}")
        args = R.engine_cfg(c).engine.engine_args
        assert args.get("logits_processors") == want
        assert args.get("async_scheduling") is (None if want is None else False)  # the processor needs it off
    ref = _cfg(tmp_path, "kv=fp8", "engine=reference")
    assert "logits_processors" not in R.engine_cfg(ref).engine.engine_args  # the reference engine decodes itself


def test_documents_zero_measures_only_the_users_texts_and_bad_counts_are_refused(tmp_path):
    """divergence.documents=0 with divergence.texts measures those texts alone (the config's promise); without texts
    the run says there is nothing to measure; a batch or a greedy prompt of 0 tokens is refused up front."""
    from fp8eval.core.errors import InputError
    from fp8eval.divergence.run import run
    from fp8eval.validate import validate_config

    text = tmp_path / "mine.txt"
    text.write_text("It was a bright cold day in April, and the clocks were striking thirteen. " * 20)
    validate_config(_cfg(tmp_path, "divergence.documents=0"))
    for key in ("divergence.batch=0", "divergence.prompt_tokens=0"):
        with pytest.raises(InputError, match=key.replace(".", r"\.")):
            validate_config(_cfg(tmp_path, key))
    with pytest.raises(ValueError, match="no passage to measure"):
        run(_cfg(tmp_path, "divergence.documents=0"), tmp_path / "none", out=lambda s: None)
    try:
        res = run(_cfg(tmp_path, "divergence.documents=0", f"divergence.texts=[{text}]", "divergence.lengths=[48]",
                       "divergence.path=prefill"), tmp_path / "r", out=lambda s: None)
    except Exception as e:  # noqa: BLE001 - the embedded model is part of the install; say so if absent
        pytest.skip(f"embedded model unavailable: {e}")
    assert [p["book"] for p in res["passages"]] == ["mine.txt"] and res["overall"]["n_tokens"] == 47
