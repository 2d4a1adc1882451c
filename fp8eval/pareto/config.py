"""Typed config of `python -m fp8eval.pareto` (its own Hydra schema, `pareto_schema`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from fp8eval.config import PairedCliConfig
from fp8eval.divergence.config import DivergenceConfig


@dataclass
class ParetoConfig:
    # kv options (conf/kv/<name>.yaml) to sweep; each is combined with every skip list and calibration.
    formats: list[str] = field(default_factory=lambda: [
        "fp8", "fp8_per_token_head", "int8_per_token_head", "int4_per_token_head", "turboquant_k8v4",
        "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "nvfp4"])
    # Skip lists (layer indices and/or "sliding_window"); [] = none. Each is checked for feasibility first.
    skip_lists: list[list[Any]] = field(default_factory=lambda: [[]])
    # A sensitivity.json whose recommended skip list is added to skip_lists (null: none).
    sensitivity: Optional[str] = None
    # Scales sources for the per-tensor FP8 formats (null = uncalibrated, scale 1.0); other formats ignore them.
    calibrations: list[Optional[str]] = field(default_factory=lambda: [None])
    # Prefill chunk for every arm (the reference engine's engine.prefill_chunk; vLLM's max_num_batched_tokens):
    # TurboQuant attends to raw K/V within a chunk of more than 128 tokens and in the first chunk, so only
    # chunks of at most 128 show its cache. null: the engine's own setting.
    prefill_chunk: Optional[int] = 128
    # Target: the smallest-memory feasible configuration with overall KL <= max_kl (nats) ...
    max_kl: Optional[float] = None
    # ... and, with `task`, recovery CI lower bound >= min_recovery (percent).
    min_recovery: Optional[float] = None
    # Task recovery on the survivors (a task option, e.g. niah; null: divergence only), paired with the baseline.
    task: Optional[str] = None
    task_overrides: list[str] = field(default_factory=list)  # extra `python -m fp8eval` overrides, e.g. task.limit=20
    survivors: int = 3  # how many of the lowest-KL feasible points go on to task recovery / perf
    # Perf on the survivors (python -m fp8eval.perf, needs a GPU server): ITL slope, capacity, break-even.
    perf: bool = False
    perf_overrides: list[str] = field(default_factory=list)
    # vllm-serve line: the model path or hub id to print (null: model.hf_id).
    serve_model: Optional[str] = None
    # Formats that need hardware other than a Hopper GPU (nvfp4: SM100) are measured (emulated) but never picked.
    exclude_needs: bool = True
    # Feasibility of skip lists (fp8eval.feasibility): auto | rule | oracle | off.
    feasibility: str = "auto"
    plot: bool = True


@dataclass
class ParetoRunConfig(PairedCliConfig):
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)
    pareto: ParetoConfig = field(default_factory=ParetoConfig)
    records_dir: str = "outputs/records"
    seed: int = 1234


FEASIBILITY = ("auto", "rule", "oracle", "off")


def validate(p: ParetoConfig) -> list[str]:
    """Problems with the pareto settings, each naming the key ([] = fine)."""
    problems = []
    if not p.formats:
        problems.append("pareto.formats is empty: name one or more kv options")
    if p.feasibility not in FEASIBILITY:
        problems.append(f"pareto.feasibility={p.feasibility!r}; valid: {', '.join(FEASIBILITY)}")
    if p.survivors < 1:
        problems.append(f"pareto.survivors={p.survivors}: must be >= 1")
    if p.prefill_chunk is not None and p.prefill_chunk < 1:
        problems.append(f"pareto.prefill_chunk={p.prefill_chunk}: must be >= 1 or null")
    if p.min_recovery is not None and not p.task:
        problems.append("pareto.min_recovery needs pareto.task (the task whose recovery it bounds)")
    if p.max_kl is not None and p.max_kl < 0:
        problems.append(f"pareto.max_kl={p.max_kl}: must be >= 0")
    return problems
