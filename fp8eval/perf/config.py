"""Typed configuration of `python -m fp8eval.perf` (ConfigStore `perf_schema`, `conf/perf.yaml`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fp8eval.config import EngineGroupsConfig


@dataclass
class PerfSettings:
    # Build the model from a config.json with random weights (vLLM load_format=dummy, no tokenizer):
    # speed needs no weights. The config comes from conf/perf_models/<model.name>/ unless config_dir is set.
    dummy_weights: bool = False
    config_dir: str | None = None
    # Load generator: auto (vllm bench serve where vLLM is importable, else builtin) | vllm_bench | builtin
    client: str = "auto"
    # kv options measured, in order; empty = [baseline, kv.name]
    arms: list[str] = field(default_factory=list)
    # --- latency sweep: concurrency 1, log-spaced input lengths ---
    lengths: list[int] | None = None  # explicit input lengths (overrides the three below)
    sweep_points: int = 8
    min_input: int = 256
    max_input: int | None = None  # default: max_model_len - sweep_output_tokens - 64
    sweep_output_tokens: int = 128
    sweep_requests: int = 3  # per length; the point is the median over them
    warmup_requests: int = 2  # sent (and discarded) before the sweep of each arm
    # --- throughput under load ---
    throughput: bool = True
    throughput_requests: int = 150
    throughput_concurrency: int = 8
    throughput_input: int = 20000
    throughput_output: int = 2000
    throughput_jitter: float = 0.15  # ± fraction of both lengths (vllm bench --random-range-ratio)
    # --- honesty ---
    measure_client_overhead: bool = True  # the same client against a zero-latency fake server
    prefix_caching: bool = False  # managed servers: --no-enable-prefix-caching unless true
    vocab_size: int | None = None  # for built-in token-id prompts; default from the model's config.json
    request_timeout_s: float = 1800.0
    # Start every arm's server at once (shorter wall time); each must then get its share of the device,
    # e.g. +engine.engine_args.kv_cache_memory_bytes=... and gpu_memory_utilization=0.45.
    parallel_start: bool = False
    plots: bool = True


@dataclass
class PerfRunConfig(EngineGroupsConfig):
    perf: PerfSettings = field(default_factory=PerfSettings)
    seed: int = 1234
    baseline: str = "bf16"
