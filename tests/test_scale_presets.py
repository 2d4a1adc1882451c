"""experiment=<preset> bundles compose and dry-run; the Hydra launchers' configs compose; DP/TP and the
fingerprint."""

from __future__ import annotations

import pytest
from conftest import REPO, compose, run_cli

from fp8eval.engines.parallel import fingerprint_view
from fp8eval.plan import estimate, format_plan
from fp8eval.runner import effective_sampling

PRESETS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


def test_the_seed_presets_exist():
    assert PRESETS == ["seed_kimi_k2_5_flashmla", "seed_mrcr_qwen3_30b", "seed_mrcr_qwen3_5_27b_1m",
                       "seed_niah_128k", "seed_reasoning_qwen3_30b_thinking"]


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_composes_and_states_its_cost(preset):
    cfg = compose([f"experiment={preset}"])
    assert cfg.plan.gpus and cfg.plan.prefill_tok_s and cfg.plan.throughput_source
    assert cfg.baseline == "bf16" and cfg.kv.name == "fp8"
    text = format_plan(cfg, effective_sampling(cfg))
    assert "GPU-hours: " in text and "prefill tokens per arm: " in text and "unknown" not in text, text


def test_mrcr_plans_match_docs_mrcr():
    """docs/mrcr.md: 38.7 M prefill tokens per arm to 256k, 156.7 M to 1M (a 1,010,000-token model stops
    the 1M bin's upper bound a little lower)."""
    cfg = compose(["experiment=seed_mrcr_qwen3_30b"])
    est = estimate(cfg, effective_sampling(cfg))
    assert est.requests_per_arm == 600 and round(est.prefill_tokens_per_arm / 1e6, 1) == 38.7
    cfg = compose(["experiment=seed_mrcr_qwen3_5_27b_1m"])
    est = estimate(cfg, effective_sampling(cfg))
    assert est.requests_per_arm == 800 and 150e6 < est.prefill_tokens_per_arm < 156.7e6
    assert cfg.model.max_model_len == 1010000 and cfg.model.tensor_parallel_size == 2
    assert cfg.model.engine_args["hf_overrides"]["text_config"]["rope_parameters"]["factor"] == 4.0
    assert compose(["experiment=seed_kimi_k2_5_flashmla"]).engine.attention_backend == "FLASHMLA"


def test_dry_run_exits_zero_without_a_model(tmp_path):
    proc = run_cli(tmp_path, ["experiment=seed_mrcr_qwen3_5_27b_1m", "dry_run=true"])
    assert "dry run: no model loaded" in proc.stdout and "GPU-hours: " in proc.stdout
    assert "GPUs: 2 per engine instance" in proc.stdout
    assert not (tmp_path / "records").exists()


def _hydra_cfg(overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from fp8eval.registry import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides, return_hydra_config=True)


def test_submitit_launchers_compose():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = _hydra_cfg(["hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu",
                      "hydra.launcher.gpus_per_node=8", "shard=0/4"])
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher") and cfg.hydra.launcher.gpus_per_node == 8
    assert _hydra_cfg(["hydra/launcher=submitit_local"]).hydra.launcher._target_.endswith("LocalLauncher")


def test_ray_launcher_composes():
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    cfg = _hydra_cfg(["hydra/launcher=ray", "hydra.launcher.ray.init.address=auto"])
    assert cfg.hydra.launcher._target_.endswith("RayLauncher") and cfg.hydra.launcher.ray.init.address == "auto"


def test_tp_in_the_fingerprint_dp_not():
    from fp8eval.arms import arm_spec

    def view(overrides):
        cfg = compose(["engine=vllm", *overrides])
        return fingerprint_view({"kind": "vllm", "engine_args": arm_spec(cfg, cfg.kv).engine_args})

    base = view([])
    assert view(["+engine.engine_args.data_parallel_size=4"]) == base
    assert view(["model.tensor_parallel_size=2"]) != base
    external = {"kind": "server", "declared_engine_args": {"model": "m", "data_parallel_size": 2}}
    assert fingerprint_view(external)["declared_engine_args"] == {"model": "m"}
    plain = {"kind": "vllm", "engine_args": {"model": "m"}}
    assert fingerprint_view(plain) == plain
