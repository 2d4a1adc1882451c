"""`python -m fp8eval.probe`: the CPU emulation path and the message where no FP8 GPU is present."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from fp8eval import probe  # noqa: E402


def test_no_fp8_gpu_gives_a_clear_message_and_exit_2(capsys, monkeypatch):
    monkeypatch.setattr(probe, "fp8_gpu_problem", lambda: "no CUDA GPU is visible to torch")
    assert probe.main(["--lengths", "1024"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "--emulate" in err


def test_emulated_curve_grows_with_length_and_promotion_stays_flat(tmp_path, capsys):
    assert probe.main(["probe.emulate=true", "--lengths", "1024,8192", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == str(tmp_path)
    res = json.loads((tmp_path / "probe.json").read_text())
    fast, promoted = res["rel_error"]["emulated_fast_fp8"], res["rel_error"]["emulated_promoted"]
    assert res["lengths"] == [1024, 8192] and "hardware_fast_accum" not in res["rel_error"]
    assert fast[0] < fast[1] and max(promoted) < fast[1]
    assert 1e-5 < fast[0] < 1e-2
    assert (tmp_path / "probe.png").stat().st_size > 0


def test_gpu_path_with_a_stand_in_for_the_hardware(monkeypatch):
    """The GPU flow (hardware curves, emulation up to EMULATE_MAX, ratios, --fit) with _scaled_mm stubbed."""
    monkeypatch.setattr(probe, "fp8_gpu_problem", lambda: None)
    monkeypatch.setattr(probe, "hardware_errors",
                        lambda p, v, ref: {"hardware_fast_accum": 1e-3, "hardware_promoted": 1e-4})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "StandIn")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    real_inputs = probe.inputs
    monkeypatch.setattr(probe, "inputs", lambda n, s, d: real_inputs(n, s, "cpu"))
    monkeypatch.setattr(probe, "EMULATE_MAX", 1024)
    r = probe.probe([1024, 2048], emulate_only=False, seeds=1, fit=True)
    assert r["rel_error"]["hardware_fast_accum"] == [1e-3, 1e-3]
    assert r["rel_error"]["emulated_fast_fp8"][1] is None  # beyond EMULATE_MAX on a GPU
    assert r["emulated_over_hardware_fast"][0] == pytest.approx(r["rel_error"]["emulated_fast_fp8"][0] / 1e-3, rel=1e-2)
    assert r["fit"]["best_bits"] in range(11, 18) and r["fit"]["lengths"] == [1024, 2048]
    assert r["fit"]["best_align"] in ("products", "sum") and len(r["fit"]["by_candidate"]) == 14
