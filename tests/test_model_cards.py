"""Every conf/model/*.yaml composes, cites its sources, and matches the values those sources give (context,
sampling, template switches); every model has an architecture config.json for `model.dummy=true`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import compose

REPO = Path(__file__).resolve().parents[1]
# hf: your own model (model.hf_id=...), no preset: tests/test_cli.py composes it from a model directory
MODELS = sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml") if p.stem != "hf")

# model -> (a URL its YAML must cite, the values that source gives). None: not set by the config.
CARDS = {
    "qwen3.5-27b": ("https://huggingface.co/Qwen/Qwen3.5-27B",
                    {"max_model_len": 262144, "temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
                     "presence_penalty": 1.5, "repetition_penalty": 1.0, "max_tokens": 32768}),
    "qwen3.5-27b-1m": ("https://github.com/vllm-project/recipes/blob/main/models/Qwen/Qwen3.5-27B.yaml",
                       {"max_model_len": 1010000, "temperature": 1.0, "top_p": 0.95, "top_k": 20,
                        "presence_penalty": 1.5, "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}}),
    "kimi-k2.5": ("https://docs.sglang.io/docs/basic_usage/kimi_k2_5",
                  {"max_model_len": 262144, "temperature": 1.0, "top_p": 0.95, "max_tokens": 98304}),
    "gpt-oss-20b": ("https://huggingface.co/openai/gpt-oss-20b",
                    {"max_model_len": 131072, "temperature": 1.0, "top_p": 1.0,
                     "chat_template_kwargs": {"reasoning_effort": "high"}}),
    "gemma-4-e2b": ("https://github.com/vllm-project/recipes/blob/main/models/Google/gemma-4-E2B-it.yaml",
                    {"max_model_len": 131072, "temperature": 1.0, "top_p": 0.95, "top_k": 64}),
    "qwen3-30b": ("https://huggingface.co/Qwen/Qwen3-30B-A3B-Instruct-2507",
                  {"max_model_len": 262144, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0}),
}
# Template switches each model's chat template reads (vLLM drops the others): the name, never a look-alike.
SWITCHES = {"kimi-k2.5": "thinking", "qwen3.5-27b": "enable_thinking", "gemma-4-e2b": "enable_thinking",
            "gpt-oss-20b": "reasoning_effort"}


@pytest.mark.parametrize("name", MODELS)
def test_every_model_config_composes_and_has_an_architecture(name):
    cfg = compose([f"model={name}", "engine=fake"])
    assert cfg.model.name == name and cfg.model.max_model_len > 0
    arch = REPO / "conf" / "perf_models" / name / "config.json"
    assert arch.is_file(), f"model.dummy=true needs {arch}"
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.from_pretrained(str(arch.parent))
    text = getattr(config, "text_config", None) or config
    assert text.num_hidden_layers >= 1


@pytest.mark.parametrize("name", sorted(CARDS))
def test_model_config_matches_its_cited_card(name):
    url, want = CARDS[name]
    text = (REPO / "conf" / "model" / f"{name}.yaml").read_text()
    assert url in text, f"conf/model/{name}.yaml does not cite {url}"
    m = compose([f"model={name}", "engine=fake"]).model
    got = {"max_model_len": m.max_model_len, "env": dict(m.env),
           "chat_template_kwargs": dict(m.chat_template_kwargs),
           **{k: getattr(m.sampling, k) for k in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                                                   "repetition_penalty", "max_tokens")}}
    for key, value in want.items():
        assert got[key] == value, f"{name}: {key} is {got[key]!r}, its card says {value!r}"


@pytest.mark.parametrize("name", sorted(SWITCHES))
def test_template_switch_names_are_the_templates_own(name):
    text = (REPO / "conf" / "model" / f"{name}.yaml").read_text()
    assert SWITCHES[name] in text
    m = compose([f"model={name}", "engine=fake"]).model
    assert set(m.chat_template_kwargs) <= {SWITCHES[name]}
    if name == "kimi-k2.5":
        assert "enable_thinking" not in "".join(line for line in text.splitlines() if not line.startswith("#"))
        preset = (REPO / "conf" / "experiment" / "seed_kimi_k2_5_flashmla.yaml").read_text()
        assert "thinking: false" in preset and "enable_thinking" not in preset


def test_qwen35_1m_is_the_cards_yarn_and_the_1m_preset_uses_it():
    m = compose(["model=qwen3.5-27b-1m", "engine=fake"]).model
    rope = m.engine_args["hf_overrides"]["text_config"]["rope_parameters"]
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == ("yarn", 4.0, 262144)
    preset = compose(["experiment=seed_mrcr_qwen3_5_27b_1m", "engine=fake"])
    assert preset.model.name == "qwen3.5-27b-1m" and preset.model.max_model_len == 1010000
    assert preset.model.env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1"
    top = json.loads((REPO / "conf" / "perf_models" / "qwen3.5-27b-1m" / "config.json").read_text())
    # the card's multimodal wrapper: vLLM 0.26.0 refused the text-only config on the H200 (Invalid type of HF config)
    assert top["architectures"] == ["Qwen3_5ForConditionalGeneration"] and top["model_type"] == "qwen3_5"
    arch = top["text_config"]
    assert arch["rope_parameters"]["rope_type"] == "yarn" and arch["rope_parameters"]["factor"] == 4.0


def test_gemma4_architecture_head_dims_and_kv_sharing():
    arch = json.loads((REPO / "conf" / "perf_models" / "gemma-4-e2b" / "config.json").read_text())
    assert (arch["head_dim"], arch["global_head_dim"], arch["num_kv_shared_layers"]) == (256, 512, 20)
    from fp8eval.engines.audit.reference import config_layers

    rows = config_layers(REPO / "conf" / "perf_models" / "gemma-4-e2b")
    own = [r for r in rows if not r["kv_sharing_target"]]
    assert [r["index"] for r in own] == list(range(15))
    assert sum(1 for r in own if r["sliding_window"]) == 12  # 12 sliding + 3 full layers hold a cache


def test_kimi_dummy_architecture_is_layer_reduced_and_says_so():
    arch = json.loads((REPO / "conf" / "perf_models" / "kimi-k2.5" / "config.json").read_text())
    assert arch["num_hidden_layers"] < 61 and arch["n_routed_experts"] == 384 and arch["kv_lora_rank"] == 512
    assert "layer-reduced" in (REPO / "conf" / "perf_models" / "README.md").read_text()
