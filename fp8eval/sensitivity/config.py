"""Typed configuration of `python -m fp8eval.sensitivity` (Hydra ConfigStore; unknown keys fail)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from fp8eval.config import PairedCliConfig
from fp8eval.divergence.measures import DEFAULT_EDGES

RANK_BY = ("only_this", "all_but_this")
FEASIBILITY = ("auto", "rule", "oracle", "off")


@dataclass
class SensitivityConfig:
    # Passage lengths in tokens (BOS included), as `python -m fp8eval.divergence` cuts them from the shipped
    # haystack books; every configuration is prefilled on each passage.
    lengths: list[int] = field(default_factory=lambda: [1024])
    # Passages per length (each from its own book where there are enough books: divergence.documents).
    documents: int = 1
    # Share of the full-FP8 divergence the recommended BF16 layers must remove (0 < target <= 1).
    target: float = 0.5
    # Score that orders the layers: the divergence with only that layer in FP8 (`only_this`: measured
    # against zero, the least noisy), or the divergence removed by keeping that layer alone in BF16
    # (`all_but_this`: kl_full_fp8 - kl_all_but_this).
    rank_by: str = "only_this"
    # After measuring the recommended skip list: if it removes less than the target, add the next ranked
    # layer and measure again, at most this many times (each costs one prefill per document and length).
    refine: int = 2
    # Position bucket edges in tokens, the divergence probe's by default (the last bucket is open).
    edges: list[int] = field(default_factory=lambda: list(DEFAULT_EDGES))
    # Keep the BF16 arm's logits of a passage in memory up to this size (else made again from its hidden
    # states for every comparison: one more lm_head matmul per pass).
    cache_logits_gib: float = 1.0
    progress: bool = True
    # Can vLLM serve the recommended skip list (fp8eval.feasibility)? auto: vLLM's own grouping when a vLLM is
    # importable (FP8EVAL_VLLM_PYTHON), else the rule vLLM 0.26.0 showed; rule; oracle; off (no check).
    feasibility: str = "auto"
    # The kernel path each pass reads (fp8eval/divergence/paths.py): decode (the passage's decode path, what generated
    # answers see, computed in one pass at the cost of a prefill: Probe.decode_hidden) or prefill (one prefill per
    # pass). They differ only where the emulation models a decode kernel (kv.fa3_decode).
    path: str = "decode"


@dataclass
class SensitivityRunConfig(PairedCliConfig):
    sensitivity: SensitivityConfig = field(default_factory=SensitivityConfig)
    # Per-passage results are kept under <records_dir>/sensitivity/<fingerprint>/ (resumable).
    records_dir: str = "outputs/records"


def validate(s: SensitivityConfig) -> list[str]:
    """Problems with the sensitivity settings, each naming the key and what is valid ([] = fine)."""
    problems = []
    if not s.lengths or any(int(n) < 2 for n in s.lengths):
        problems.append(f"sensitivity.lengths={list(s.lengths)}: give one or more token lengths >= 2")
    if s.documents < 1:
        problems.append(f"sensitivity.documents={s.documents}: must be >= 1")
    if not 0 < s.target <= 1:
        problems.append(f"sensitivity.target={s.target}: must be in (0, 1]")
    if s.rank_by not in RANK_BY:
        problems.append(f"sensitivity.rank_by={s.rank_by!r}; valid: {', '.join(RANK_BY)}")
    if s.feasibility not in FEASIBILITY:
        problems.append(f"sensitivity.feasibility={s.feasibility!r}; valid: {', '.join(FEASIBILITY)}")
    if s.path not in ("prefill", "decode"):
        problems.append(f"sensitivity.path={s.path!r}; valid: prefill, decode")
    if s.refine < 0:
        problems.append(f"sensitivity.refine={s.refine}: must be >= 0")
    if not s.edges or list(s.edges) != sorted(set(s.edges)) or s.edges[0] != 0:
        problems.append(f"sensitivity.edges={list(s.edges)}: strictly increasing, starting at 0")
    return problems


def unknown_key_message(key: str) -> str | None:
    """A misspelt `sensitivity.x` / `model.x` / `kv.x` / `engine.x` override, with the valid keys."""
    from fp8eval.overrides import unknown_key_message as run_key_message

    parts = key.split(".")
    if parts[0] == "sensitivity":
        valid = {f.name for f in dataclasses.fields(SensitivityConfig)}
        if len(parts) > 1 and parts[1] not in valid:
            return f"unknown key {key!r}; valid keys under sensitivity: {', '.join(sorted(valid))}"
        return None
    if parts[0] in ("model", "kv", "engine"):
        return run_key_message(key, "niah")
    top = {f.name for f in dataclasses.fields(SensitivityRunConfig)}
    if parts[0] not in top and parts[0] != "hydra":
        return f"unknown key {key!r}; valid top-level keys: {', '.join(sorted(top))}"
    return None
