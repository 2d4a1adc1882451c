"""scripts/gpu/summarize_validation.py on a synthetic work dir: closest emulation mode, niah preflight, steps."""

from __future__ import annotations

import importlib.util
import json

from conftest import REPO

spec = importlib.util.spec_from_file_location("summarize_validation", REPO / "scripts/gpu/summarize_validation.py")
S = importlib.util.module_from_spec(spec)
spec.loader.exec_module(S)


def _div(path, engine, kl, top1, topk_view=None):
    buckets = {b: {"kl_mean": k, "top1_agree": t, "dlogp_mean": 0.1, "n_tokens": 10}
               for b, k, t in zip(("0-256", "256-1k"), kl, top1)}
    d = {"model": "m", "kv": "fp8", "baseline": "bf16", "engine": engine, "topk": 20,
         "method": "topk_shared_renormalised" if engine == "vllm" else "exact_full_vocabulary",
         "buckets": buckets, "overall": buckets["0-256"], "arms": {"fp8": {"fingerprint": "f"}}}
    if topk_view:
        d["topk_view"] = {"buckets": {b: {"kl_mean": k, "top1_agree": t, "dlogp_mean": 0.1, "n_tokens": 10}
                                      for b, k, t in zip(("0-256", "256-1k"), *topk_view)}}
    path.mkdir(parents=True)
    (path / "divergence.json").write_text(json.dumps(d))


def test_summary_names_the_closest_mode_and_niah_skips(tmp_path, capsys):
    w, out = tmp_path / "work", tmp_path / "out"
    _div(w / "div" / "vllm_m", "vllm", [1e-2, 2e-2], [0.92, 0.90])
    _div(w / "div" / "ref_kv_only", "reference", [9e-3, 9e-3], [0.93, 0.93], topk_view=([7e-3, 1e-2], [0.93, 0.93]))
    _div(w / "div" / "ref_fa3", "reference", [1e-2, 3e-2], [0.92, 0.9], topk_view=([1.1e-2, 2.1e-2], [0.92, 0.9]))
    rec = w / "records" / "niah"
    rec.mkdir(parents=True)
    for arm, skip in (("bf16", []), ("fp8", []), ("fp8_skip_sw", ["sliding_window"])):
        (rec / f"{arm}.arm.json").write_text(json.dumps({"material": {"engine": {"preflight": {
            "cache_dtype": "auto" if arm == "bf16" else "fp8", "kv_cache_dtype_skip_layers": skip,
            "attention_backend": "FLASH_ATTN"}}}}))
    for run, arms, base in (("gemma_fp8", ("bf16", "fp8"), "bf16"), ("gemma_fp8_skip_sw", ("fp8_skip_sw",), None)):
        (w / "niah" / run).mkdir(parents=True)
        (w / "niah" / run / "summary.json").write_text(json.dumps({
            "model": "g", "baseline": base, "recovery": {"overall": 90.0} if base else None,
            "arms": {a: {"score": 0.8 if a == "bf16" else 0.6, "records": str(rec / f"{a}.jsonl"), "n_records": 18,
                         "n_errors": 0, "n_skipped": 0} for a in arms}}))
    (w / "probe").mkdir()
    (w / "probe" / "probe.json").write_text(json.dumps({"device": "H200", "seconds": 9, "lengths": [1024],
                                                        "rel_error": {"hardware_fast_accum": [5e-4]},
                                                        "fit": {"best_align": "sum", "best_bits": 13, "within_2x": True}}))
    (w / "steps.tsv").write_text("probe\t0\t9\t\nniah_x\t-1\t0\tskipped: 10 s left, needs 50\n")
    assert S.main([str(w), str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    c = summary["closest_modes"]["m"]
    assert c["kernel"] == "vllm_m" and c["closest"] == "ref_fa3"
    assert c["closest_per_bucket"] == {"0-256": "ref_fa3", "256-1k": "ref_fa3"}
    n = summary["niah"]
    assert n["gemma_fp8_skip_sw"]["arms"]["fp8_skip_sw"]["preflight"]["kv_cache_dtype_skip_layers"] == ["sliding_window"]
    assert n["gemma_fp8_skip_sw"]["recovery"] == 75.0 and n["gemma_fp8"]["recovery"] == 90.0
    text = capsys.readouterr().out
    assert "closest to the kernel: ref_fa3" in text and "skipped: 10 s left" in text and "align=sum, 13 fraction bits" in text
    assert (out / "summary.txt").read_text().strip() == text.strip()
