"""Engines say what they can do (`capabilities`, fp8eval/engines/base.py), wings ask: the table of facts per engine
kind checked against the engine classes; no file outside fp8eval/engines/ compares an engine kind to a literal
name; no module outside the reference engine reaches its private attributes."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from fp8eval.config import EngineConfig
from fp8eval.engines import ENGINES, engine_class
from fp8eval.engines.base import Capabilities, EngineBase

PKG = Path(__file__).resolve().parents[1] / "fp8eval"

# The facts, per engine kind, as docs/ARCHITECTURE.md states them ("Engine protocol").
TABLE = {
    "fake": dict(distributions="none", loglikelihood=True, teacher_force=True, follows_sampling=False,
                 prefill_chunking="none", early_counter="", switches_kv_policy=False, decode_path="none"),
    "reference": dict(distributions="hidden", loglikelihood=True, teacher_force=True, follows_sampling=True,
                      prefill_chunking="engine", early_counter="", switches_kv_policy=True, decode_path="probe"),
    "vllm": dict(distributions="topk", loglikelihood=True, teacher_force=True, follows_sampling=True,
                 prefill_chunking="scheduler", early_counter="fp8eval.engines.vllm.early:TokenizerWorker",
                 switches_kv_policy=False, decode_path="forced"),
    "server": dict(distributions="none", loglikelihood=True, teacher_force=True, follows_sampling=True,
                   prefill_chunking="none", early_counter="", switches_kv_policy=False, decode_path="none"),
}
# A capability flag and the EngineBase method an engine must override to have it.
METHOD_OF = {"loglikelihood": "loglikelihood", "teacher_force": "teacher_force"}


def _classes(kind: str) -> list[type]:
    """The classes that serve `kind` (the server factory builds one server or a replica pool)."""
    target = engine_class(kind)
    if isinstance(target, type):
        return [target]
    from fp8eval.engines.pool import PoolEngine
    from fp8eval.engines.server import ServerEngine

    return [ServerEngine, PoolEngine]


def _overrides(cls: type, name: str) -> bool:
    return getattr(cls, name) is not getattr(EngineBase, name)


@pytest.mark.parametrize("kind", sorted(ENGINES))
def test_each_engine_class_declares_its_facts_and_has_what_it_declares(kind):
    caps = engine_class(kind).capabilities
    assert isinstance(caps, Capabilities)
    assert {k: getattr(caps, k) for k in TABLE[kind]} == TABLE[kind]
    assert caps.distributions in ("hidden", "topk", "none")
    assert caps.prefill_chunking in ("engine", "scheduler", "none")
    assert {f.name for f in dataclasses.fields(EngineConfig)} >= set(caps.engine_fields)
    assert all(rule in ("batch_cap", "positive") and why for _, rule, why in caps.honoured_args)
    assert caps.control_hint, "the inert control's refusal names what takes effect on it"
    for cls in _classes(kind):
        assert issubclass(cls, EngineBase) and cls.capabilities is caps and cls.kind == kind
        for flag, method in METHOD_OF.items():
            assert getattr(caps, flag) == _overrides(cls, method), (cls.__name__, flag)
        assert (caps.distributions == "topk") == _overrides(cls, "prompt_logprobs"), cls.__name__
        assert (caps.distributions == "hidden") == _overrides(cls, "probe"), cls.__name__
        assert (caps.decode_path == "forced") == _overrides(cls, "decode_logprobs_many"), cls.__name__
    assert caps.decode_path in ("probe", "forced", "none") and (caps.decode_path == "forced") == bool(
        caps.decode_logits_processor)
    if caps.decode_path == "probe":
        assert caps.distributions == "hidden"
    if caps.switches_kv_policy:
        assert caps.distributions == "hidden"  # the policy is switched through the probe
    if caps.early_counter:
        module, _, name = caps.early_counter.partition(":")
        worker = getattr(__import__(module, fromlist=[name]), name)
        assert callable(worker.prepare)


def test_the_optional_half_refuses_with_a_clear_message_and_informs_with_nothing():
    class Bare(EngineBase):
        kind = "bare"

        def count_prompt_tokens(self, request):
            return 3

    e = Bare()
    for call in (lambda: e.loglikelihood([]), lambda: e.teacher_force(None, "a", "b"),
                 lambda: e.prompt_logprobs([1, 2], 5), lambda: e.probe()):
        with pytest.raises(NotImplementedError, match="the bare engine cannot .* capabilities"):
            call()
    assert e.token_count_key() is None and e.prefill_stats() is None and e.pool_stats() is None
    assert e.startup_warnings() is None and e.audit_now() is None and e.preflight is None and e.startup_log == ""
    assert e.count_prompt_tokens_many([object(), object()]) == [3, 3]


# --- no wing names an engine ------------------------------------------------------------------------------------
# A CLI's list of choices aside: `python -m fp8eval.knobaudit corpus --engine vllm|vllm_cpu|reference` names engine
# config options, and the overrides it builds from that choice.
CLI_CHOICES = {"knobaudit/check.py", "knobaudit/__main__.py"}


def _kind_literals(node, kinds) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in kinds
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
        return all(_kind_literals(e, kinds) for e in node.elts)
    return False


def test_no_file_outside_engines_compares_an_engine_kind_to_a_literal_name():
    kinds = set(ENGINES)
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith("engines/") or rel in CLI_CHOICES:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and any(_kind_literals(x, kinds) for x in [node.left, *node.comparators]):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("startswith", "get") and node.args and _kind_literals(node.args[0], kinds)):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Dict) and node.keys and all(k is not None and _kind_literals(k, kinds)
                                                                  for k in node.keys):
                found.append(f"{rel}:{node.lineno}: a table keyed by engine kind")
            elif isinstance(node, (ast.Tuple, ast.List)) and node.elts and _kind_literals(node, kinds):
                found.append(f"{rel}:{node.lineno}: a list of engine kinds {ast.unparse(node)}")
    assert not found, "ask the engine's capabilities instead:\n" + "\n".join(found)


# --- no module opens the reference engine up ---------------------------------------------------------------------
# The reference engine's own helpers inside engines/: its probe, its decode-path step logits, its knob audit.
REFERENCE_HELPERS = {"engines/reference.py", "engines/reference_probe.py", "engines/step_logits.py",
                     "engines/audit/live.py"}


def test_no_module_outside_the_reference_engine_reaches_its_private_attributes():
    tree = ast.parse((PKG / "engines" / "reference.py").read_text(encoding="utf-8"))
    private = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
               and n.value.id == "self" and n.attr.startswith("_") and not n.attr.startswith("__")}
    assert {"_load", "_model", "_policy", "_shared"} <= private
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel in REFERENCE_HELPERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr in private
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "use the engine's public probe (engine.probe(policy), engine.kv_policy):\n" + "\n".join(found)

