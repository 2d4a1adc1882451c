"""fp8eval.sensitivity: ranking and skip-list logic, K/V statistics, config and CLI checks (fast), and
the whole flow on both embedded models at tiny lengths (slow)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fp8eval.sensitivity import ranking  # noqa: E402
from fp8eval.sensitivity.config import SensitivityConfig, unknown_key_message, validate  # noqa: E402
from fp8eval.sensitivity.kvstats import KVStatsAccumulator, head_counts  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def compose_sensitivity(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from fp8eval.sensitivity.__main__ import register

    register()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="sensitivity", overrides=overrides)
    return OmegaConf.to_object(cfg)


# --- ranking ----------------------------------------------------------------------------------------------
def test_smallest_skip_set_is_the_shortest_prefix_reaching_the_target():
    scores = {0: 5.0, 1: 1.0, 2: 3.0, 3: 1.0}  # total 10
    order = ranking.rank(scores)
    assert order == [0, 2, 1, 3]
    assert ranking.smallest_skip_set(order, scores, 0.5) == [0]  # 5/10 reaches 0.5 exactly
    assert ranking.smallest_skip_set(order, scores, 0.51) == [0, 2]
    assert ranking.smallest_skip_set(order, scores, 1.0) == [0, 1, 2, 3]
    assert ranking.smallest_skip_set(order, {0: 0.0, 1: 0.0}, 0.5) == []  # nothing to remove
    assert ranking.predicted_share(scores, [0, 2]) == pytest.approx(0.8)


def test_scores_by_removal_gain_clip_noise_and_ties_break_by_tiebreak():
    s = ranking.layer_scores(1.0, {0: 0.1, 1: 0.2}, {0: 0.7, 1: 1.05}, "all_but_this")
    assert s == {0: pytest.approx(0.3), 1: 0.0}
    assert ranking.rank({0: 1.0, 1: 1.0, 2: 1.0}, tiebreak={2: 0.5, 1: 0.1}) == [2, 1, 0]
    with pytest.raises(ValueError):
        ranking.layer_scores(1.0, {}, {}, "nope")


def test_kv_bytes_ratio_counts_skipped_layers_at_two_bytes():
    values = {0: 384, 1: 384, 2: 384, 3: 384}
    assert ranking.kv_bytes_ratio(values, []) == 0.5
    assert ranking.kv_bytes_ratio(values, [0, 1, 2, 3]) == 1.0
    assert ranking.kv_bytes_ratio(values, [1]) == pytest.approx(5 / 8)
    assert ranking.skip_layer_strings([10, 2]) == ["2", "10"]


def test_sliding_verdict_only_for_hybrid_models():
    layers = [{"index": i, "attention_type": "sliding_attention" if i % 3 else "full_attention"} for i in range(6)]
    scores = {0: 4.0, 1: 1.0, 2: 1.0, 3: 4.0, 4: 1.0, 5: 1.0}
    v = ranking.sliding_verdict(layers, ranking.rank(scores), [0, 3], scores, kl_full=1.0, kl_skip_sliding=0.7)
    assert v["sliding_layers"] == [1, 2, 4, 5] and v["recommended_full"] == [0, 3]
    assert v["divergence_share"] == pytest.approx(4 / 12) and not v["sliding_are_sensitive"]
    assert v["removed_by_skip_sliding"] == pytest.approx(0.3)
    assert "less sensitive per layer" in v["text"]
    assert ranking.sliding_verdict([{"index": 0, "attention_type": "full_attention"}], [0], [], {0: 1.0}) is None


# --- K/V statistics ----------------------------------------------------------------------------------------
def test_head_counts_saturation_flush_subnormal_and_rounding_error():
    # [B=1, H=2, T=4, D=1]; head 1 has scale 0.01, so its values are 100x larger once scaled.
    x = torch.tensor([[[[500.0], [1e-4], [0.005], [1.0]], [[1.0], [0.0], [2.0], [4.5]]]])
    c = head_counts(x, torch.tensor([1.0, 0.01]), "e4m3")
    assert c["amax"].tolist() == [500.0, 4.5]
    assert c["sat"].tolist() == [1, 1]  # 500 > 448; 4.5 / 0.01 = 450 > 448
    assert c["ftz"].tolist() == [1, 0]  # 1e-4 < 2^-10 rounds to 0; head 1's zero is not counted
    assert c["sub"].tolist() == [1, 0]  # 0.005 < 2^-6 is stored subnormal
    assert c["nonzero"].tolist() == [4, 3]
    # Head 1 scaled: 100 and 200 are ties between e4m3 neighbours and round to even (96, 192): 4% each;
    # 4.5 saturates to 4.48.
    assert float(c["rel_err_sum"][1]) == pytest.approx(0.04 + 0.04 + 0.02 / 4.5, rel=1e-5)
    acc = KVStatsAccumulator("e4m3")
    acc.add("k", 3, x, 1.0)
    acc.add("v", 3, x * 0.5, 1.0)
    st = acc.layer_stats(3)
    assert st["k_amax"] == 500.0 and st["v_amax"] == 250.0
    assert st["sat_rate"] == pytest.approx(1 / 16)  # only k's 500 saturates at scale 1.0
    assert len(st["k_heads"]["amax"]) == 2
    assert acc.kv_values_per_token(3) == 2 * 2 * 1


# --- configuration and CLI -------------------------------------------------------------------------------
def test_validate_and_unknown_keys_name_the_valid_choices():
    assert validate(SensitivityConfig()) == []
    bad = validate(SensitivityConfig(lengths=[], target=0.0, rank_by="x", edges=[5, 3]))
    assert len(bad) == 4 and any("only_this" in p for p in bad)
    assert "valid keys under sensitivity" in unknown_key_message("sensitivity.tagret")
    assert unknown_key_message("sensitivity.target") is None
    assert "kv has no 'engine_argz'" in unknown_key_message("kv.engine_argz")
    assert "valid top-level keys" in unknown_key_message("task.name")


def test_cli_refuses_a_misspelt_key_before_loading_anything(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fp8eval.sensitivity", "sensitivity.tagret=0.3"], cwd=tmp_path,
                          capture_output=True, text=True, env=_env())
    assert proc.returncode == 2 and "valid keys under sensitivity" in proc.stderr


def test_config_composes_with_reference_engine_default():
    cfg = compose_sensitivity(["model=gemma3-270m", "sensitivity.lengths=[64,128]"])
    assert cfg.engine.kind == "reference" and cfg.kv.name == "fp8" and cfg.sensitivity.lengths == [64, 128]


def _env() -> dict:
    import os

    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


# --- the recommended skip list as a kv option ----------------------------------------------------------
def _fake_result() -> dict:
    return {"model": "smollm2-135m", "kv": "fp8", "recommended_skip_layers": [7, 2], "removed_share": 0.6,
            "kv_bytes_ratio": 0.55}


def test_skip_list_override_and_written_kv_option_compose(tmp_path):
    from conftest import compose

    from fp8eval.arms import arm_spec
    from fp8eval.engines.vllm.args import vllm_engine_args
    from fp8eval.overrides import free_dict_overrides
    from fp8eval.sensitivity import outputs

    argv = free_dict_overrides(["kv=fp8", "kv.engine_args.kv_cache_dtype_skip_layers=[2,7]"])
    assert argv[1].startswith("++")
    cfg = compose(argv)
    assert list(cfg.kv.engine_args["kv_cache_dtype_skip_layers"]) == [2, 7]
    assert vllm_engine_args(cfg, arm_spec(cfg, cfg.kv))["kv_cache_dtype_skip_layers"] == ["2", "7"]  # vLLM: list[str]

    (tmp_path / "conf" / "kv").mkdir(parents=True)
    text = outputs.kv_option_yaml(_fake_result(), cfg.kv)
    (tmp_path / "conf" / "kv" / f"{outputs.KV_OPTION}.yaml").write_text(text)
    written = compose([f"hydra.searchpath=[file://{tmp_path / 'conf'}]", f"kv={outputs.KV_OPTION}"])
    assert list(written.kv.engine_args["kv_cache_dtype_skip_layers"]) == ["2", "7"]
    assert written.kv.engine_args["kv_cache_dtype"] == "fp8"
    cmds = outputs.next_commands(_fake_result(), tmp_path)
    assert "kv.engine_args.kv_cache_dtype_skip_layers=[2,7]" in cmds[0]


# --- the whole flow on the embedded models (slow) -----------------------------------------------------------
ISSUE_FIELDS = {"index", "attention_type", "k_amax", "v_amax", "sat_rate", "ftz_rate", "kl_only_this",
                "kl_all_but_this"}


def _flow(model: str, length: int):
    import tempfile

    from fp8eval.sensitivity.passes import Passes
    from fp8eval.sensitivity.run import run

    records = tempfile.mkdtemp(prefix="fp8eval-sensitivity-")
    cfg = compose_sensitivity([f"model={model}", f"sensitivity.lengths=[{length}]", "sensitivity.progress=false",
                               "engine.threads=1", f"records_dir={records}"])
    try:
        result = run(cfg, log=lambda *a: None)
    except Exception as e:
        if "embedded model" in str(e):
            pytest.skip(f"embedded model unavailable: {e}")
        raise
    return cfg, result, Passes


@pytest.fixture(scope="module")
def smollm2_flow():
    return _flow("smollm2-135m", 24)


@pytest.mark.slow
def test_smollm2_flow_fields_and_the_skip_list_lowers_divergence(smollm2_flow, tmp_path):
    from fp8eval.sensitivity import outputs

    cfg, result, _ = smollm2_flow
    assert len(result["layers"]) == 30 and ISSUE_FIELDS <= set(result["layers"][0])
    for key in ("ranking", "recommended_skip_layers", "kl_full_fp8", "kl_with_skip", "kv_bytes_ratio"):
        assert key in result
    assert sorted(result["ranking"]) == list(range(30))
    assert result["kl_full_fp8"] > 0
    assert result["recommended_skip_layers"]
    # The recommended BF16 layers, re-measured, lower the divergence versus full FP8.
    assert result["kl_with_skip"] < result["kl_full_fp8"]
    assert 0.5 < result["kv_bytes_ratio"] < 1.0
    assert all(d["sat_rate"] == 0 for d in result["layers"])  # SmolLM2's K/V stay far below 448
    assert result["sliding_window"] is None
    written = outputs.write(tmp_path, result, cfg.kv)
    data = json.loads((tmp_path / "sensitivity.json").read_text())
    assert data["recommended_skip_layers"] == result["recommended_skip_layers"]
    assert {p.name for p in written} >= {"sensitivity.json", "kv_skip_recommended.yaml", "sensitivity.md"}


@pytest.mark.slow
def test_a_rerun_resumes_every_pass_and_gives_the_same_numbers(smollm2_flow):
    from fp8eval.sensitivity.run import run

    cfg, first, _ = smollm2_flow
    assert first["passages_reused"] == 0 and len(first["fingerprint"]) == 64
    again = run(cfg, log=lambda *a: None)
    assert again["passages_reused"] == len(first["passages"]) and again["fingerprint"] == first["fingerprint"]
    assert {k: v for k, v in again.items() if k != "passages_reused"} == \
        {k: v for k, v in first.items() if k != "passages_reused"}


@pytest.mark.slow
def test_all_layers_skipped_gives_zero_divergence(smollm2_flow):
    from fp8eval.arms import open_engines, resolve_arms
    from fp8eval.divergence.measures import BucketAccumulator
    from fp8eval.sensitivity.passes import Baseline, Passes, compare

    cfg, _, _ = smollm2_flow
    p = Passes(cfg, open_engines(cfg), resolve_arms(cfg))
    doc = p.passages(1, [24])[0]
    base = Baseline(p, p.hidden(p.bf16, doc.ids), 1.0)
    zero, full = BucketAccumulator(), BucketAccumulator()
    compare(p, base, p.hidden(p.fp8_policy(list(range(p.n_layers))), doc.ids), zero)
    compare(p, base, p.hidden(p.fp8_policy([]), doc.ids), full)
    assert zero.overall()["kl_mean"] == 0.0 and zero.overall()["top1_agree"] == 1.0
    assert full.overall()["kl_mean"] > 0


@pytest.mark.slow
def test_gemma3_flow_says_whether_sliding_window_layers_are_the_sensitive_ones():
    _, result, _ = _flow("gemma3-270m", 24)
    sw = result["sliding_window"]
    assert sw is not None and len(sw["sliding_layers"]) == 15
    assert isinstance(sw["sliding_are_sensitive"], bool) and "sliding-window layers" in sw["text"]
    assert sw["kl_skip_sliding"] is not None and math.isfinite(sw["kl_skip_sliding"])
    assert result["kl_with_skip"] < result["kl_full_fp8"]
    types = {d["attention_type"] for d in result["layers"]}
    assert types == {"sliding_attention", "full_attention"}


def test_two_command_flow_second_command_runs_with_the_written_list(tmp_path):
    """The second command of the flow, on the fake engine: the CLI override and the written kv option both
    reach the engine, and name different arms than plain kv=fp8 (a skip list changes the fingerprint)."""
    from conftest import run_cli, summary_of

    from fp8eval.sensitivity import outputs

    cfg = compose_sensitivity([])
    conf = tmp_path / "run" / "conf" / "kv"
    conf.mkdir(parents=True)
    (conf / f"{outputs.KV_OPTION}.yaml").write_text(outputs.kv_option_yaml(_fake_result(), cfg.kv))
    fast = ["engine=fake", "task.lengths=[1024]", "task.depths=[0]", "report=false"]
    plain = summary_of(run_cli(tmp_path, [*fast, "kv=fp8"]))
    by_cli = summary_of(run_cli(tmp_path, [*fast, "kv=fp8", "kv.engine_args.kv_cache_dtype_skip_layers=[2,7]"]))
    by_file = summary_of(run_cli(tmp_path, [*fast, f"hydra.searchpath=[file://{tmp_path / 'run' / 'conf'}]",
                                            f"kv={outputs.KV_OPTION}"]))
    fps = [s["arms"][name]["fingerprint"] for s, name in ((plain, "fp8"), (by_cli, "fp8"),
                                                            (by_file, f"fp8_{outputs.KV_OPTION}"))]
    assert fps[0] != fps[1] and fps[0] != fps[2]
