"""The embedded GGUF conversion when parallel processes convert the same file (the GPU session's waves)."""

from __future__ import annotations

import transformers

from fp8eval import models


class _Fake:
    def __init__(self, target, other_wins):
        self.target, self.other_wins, self.config = target, other_wins, object()
        self.hf_quantizer = None

    def save_pretrained(self, path, **kw):
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text("{}")
        (path / "model.safetensors").write_text("mine")
        if self.other_wins:  # another process finishes its conversion while this one writes
            self.target.mkdir(parents=True, exist_ok=True)
            (self.target / "config.json").write_text("{}")
            (self.target / "model.safetensors").write_text("theirs")


def _patch(monkeypatch, target, other_wins):
    fake = _Fake(target, other_wins)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: fake)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: fake)


def test_a_conversion_finished_by_another_process_is_kept(tmp_path, monkeypatch):
    gguf, target = tmp_path / "m.gguf", tmp_path / "cache" / "m-1"
    gguf.write_bytes(b"x")
    _patch(monkeypatch, target, other_wins=True)
    assert models._convert_gguf(gguf, target) == target
    assert (target / "model.safetensors").read_text() == "theirs"  # not deleted under its readers
    assert not list(target.parent.glob("m-1.tmp*"))  # this process's copy is gone


def test_a_lone_conversion_replaces_an_incomplete_target(tmp_path, monkeypatch):
    gguf, target = tmp_path / "m.gguf", tmp_path / "cache" / "m-1"
    gguf.write_bytes(b"x")
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")  # torn: no weights
    _patch(monkeypatch, target, other_wins=False)
    assert models._convert_gguf(gguf, target) == target
    assert (target / "model.safetensors").read_text() == "mine"
    assert (target / "SOURCE.txt").exists()
