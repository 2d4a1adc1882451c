"""Adding an engine is true as docs/ARCHITECTURE.md writes it: a toy engine, registered here and nowhere else (no
file outside fp8eval/engines/ knows its name), runs the default job, the divergence probe and a control arm,
because every wing asks its `capabilities` instead of naming it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import compose

from fp8eval.engines import ENGINES
from fp8eval.engines.base import Capabilities, Choice, Completion, EngineBase, EngineError
from fp8eval.engines.fake import rule_needle

KIND = "toy"


class ToyEngine(EngineBase):
    """A perfect needle reader whose FP8 arm forgets one needle in five; its per-position top-k log-probs come
    from a seeded table (the FP8 arm's perturbed). It honours every engine arg of a control arm."""

    kind = KIND
    capabilities = Capabilities(distributions="topk", all_engine_args=True,
                                engine_args_why="the toy engine reads every engine arg", control_hint="control=batch1")
    started: list[str] = []

    def __init__(self, cfg, arm, shared=None):
        self.cfg, self.arm = cfg, arm
        self.fp8 = str(arm.engine_args.get("kv_cache_dtype", "auto")).startswith("fp8")
        ToyEngine.started.append(arm.name)

    def describe(self) -> dict:
        return {"kind": KIND, "engine_args": dict(sorted(self.arm.engine_args.items()))}

    def max_model_len(self) -> int:
        return int(self.cfg.model.max_model_len)

    def count_prompt_tokens(self, request) -> int:
        return max(1, sum(len(m["content"]) for m in request.messages) // 4)

    def generate(self, requests):
        for req in requests:
            text = rule_needle(req, 0)
            if self.fp8 and sum(map(ord, req.id)) % 5 == 0:
                text = "I don't know."
            yield Completion(request_id=req.id, choices=[Choice(text=text, finish_reason="stop", output_tokens=8)
                                                         for _ in range(req.n)],
                             prompt_tokens=self.count_prompt_tokens(req), cached_prompt_tokens=0)

    def prompt_logprobs(self, ids, k):
        logits = np.random.default_rng(len(ids)).normal(size=(len(ids) - 1, 40)) * 2
        if self.fp8:
            logits = logits + np.random.default_rng(1).normal(size=logits.shape) * 0.3
        if self.arm.engine_args.get("max_num_seqs") == 1:  # the control arm: a little noise of its own
            logits = logits + np.random.default_rng(2).normal(size=logits.shape) * 0.01
        lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        top = np.argsort(-lp, -1)[:, :k]
        return top.tolist(), np.take_along_axis(lp, top, -1).tolist()

    def close(self) -> None:
        pass


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(ENGINES, KIND, ToyEngine)  # the one registration: fp8eval.engines.ENGINES
    ToyEngine.started = []
    return [f"engine.kind={KIND}"]  # the engine group's other fields as the fake engine's YAML sets them


def test_the_toy_engine_runs_the_default_job_with_a_control_arm(tmp_path, toy):
    from fp8eval.runner import Runner

    cfg = compose(["engine=fake", *toy, f"records_dir={tmp_path / 'records'}", "progress=false", "report=false",
                   "task=niah", "task.lengths=[1024,2048]", "control=batch1"])
    summary = Runner(cfg, tmp_path / "run", out=lambda *a: None).run()
    assert list(summary["arms"]) == ["bf16", "fp8", "bf16-batch1"]
    assert all(a["engine"] == KIND and a["n_scored"] for a in summary["arms"].values())
    assert summary["arms"]["bf16"]["score"] == 1.0 > summary["arms"]["fp8"]["score"]
    assert summary["recovery"]["overall"] < 100
    assert summary["control"]["engine"] == KIND and not summary["control"]["inert"]
    knob = summary["control"]["knobs"][0]
    assert knob["knob"] == "engine_args.max_num_seqs" and knob["why"] == "the toy engine reads every engine arg"
    assert ToyEngine.started[:3] == ["fp8", "bf16", "bf16-batch1"]  # the variant first
    # the anatomy of the flips asks the capabilities too: the toy engine cannot teacher-force
    assert "cannot teacher-force" in summary["anatomy"]["fp8"]["unavailable"]
    assert (Path(tmp_path / "run") / "summary.json").is_file()
    again = Runner(cfg, tmp_path / "again", out=lambda *a: None).run()  # resumed: nothing sent again
    assert all(a["requests_sent"] == 0 for a in again["arms"].values())


def test_the_toy_engine_runs_the_divergence_probe_with_its_noise_floor(tmp_path, toy, monkeypatch):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf
    from test_divergence_run import _FakeTok

    import fp8eval.divergence.run as R
    from fp8eval.divergence.__main__ import register

    monkeypatch.setattr(R, "load_tokenizer", lambda model: _FakeTok())  # the passages need a tokenizer only
    register()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_object(hydra_compose(config_name="divergence", overrides=[
            "engine=fake", *toy, f"records_dir={tmp_path / 'records'}", "divergence.lengths=[64,80]",
            "divergence.documents=2", "divergence.topk=5", "divergence.batch=4", "divergence.plot=false",
            "divergence.path=prefill",  # the toy engine declares no decode path (capabilities.decode_path)
            "kv=fp8", "control=batch1"]))
    res = R.run(cfg, tmp_path / "d", out=lambda s: None)
    assert res["engine"] == KIND and res["method"] == "topk_shared_renormalised"
    assert 0 < res["noise_floor"]["overall"]["kl_mean"] < res["overall"]["kl_mean"]
    assert res["noise_floor"]["arm"] == "bf16-batch1" and not res["noise_floor"]["inert"]


def test_an_engine_that_gives_no_distributions_is_refused_by_the_probe_in_one_line(tmp_path, toy, monkeypatch):
    class Blind(ToyEngine):
        capabilities = Capabilities(control_hint="none")

    monkeypatch.setitem(ENGINES, KIND, Blind)
    from test_divergence_run import _cfg, _FakeTok

    import fp8eval.divergence.run as R

    monkeypatch.setattr(R, "load_tokenizer", lambda model: _FakeTok())
    with pytest.raises(EngineError, match="the toy engine gives none"):
        R.run(_cfg(tmp_path, "engine=fake", *toy, "divergence.lengths=[64]", "divergence.path=prefill"), tmp_path / "b",
              out=lambda s: None)
