"""Typed config of `python -m fp8eval.divergence` (Hydra; the model/kv/engine groups are fp8eval's own)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fp8eval.config import ControlConfig, PairedCliConfig
from fp8eval.divergence.measures import DEFAULT_EDGES


@dataclass
class DivergenceConfig:
    # Passage lengths in tokens (BOS included); each length gets `documents` passages of the shipped books.
    lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192])
    documents: int = 1
    # The user's own texts besides the books (0 documents: only these): files, each a text, or .jsonl files of
    # prompts (a string, or {"prompt"|"text"|"content": ...}, or {"messages": [...]}) a line. Each text is cut to
    # every length it reaches; a text shorter than all lengths is used whole (counted in divergence.json).
    texts: list[str] = field(default_factory=list)
    # vllm engine: log-probabilities per position from vLLM's prompt_logprobs (vLLM's max_logprobs is raised
    # to match when above its default 20). The reference engine compares full vocabularies (exact).
    topk: int = 20
    # Passages of one length sent to vLLM together (they may share its batches); 1 = one at a time. A batch-size
    # control (control=batch1, max_num_seqs=1) needs batch > 1 to differ from its baseline. On the decode path the
    # batch's passages are decoded in step (B passages cost about one passage's time), and the reference engine
    # emulates each passage as decoded in that batch (FA3's split count depends on it).
    batch: int = 1
    # Position bucket edges (tokens); the last bucket is open.
    edges: list[int] = field(default_factory=lambda: list(DEFAULT_EDGES))
    plot: bool = True
    # The kernel path whose distributions are read (fp8eval/divergence/paths.py): decode (each position as a decode step
    # computes it, the passage forced token by token: what generated answers see), prefill (one prefill of the passage:
    # reference engine's chunked prefill, vLLM's prompt_logprobs) or both (both, and each arm's decode-vs-prefill gap).
    path: str = "decode"


@dataclass
class DivergenceRunConfig(PairedCliConfig):
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)
    # A noise-floor control arm (conf/control/): its KL from the baseline is printed beside the variant's.
    control: ControlConfig = field(default_factory=ControlConfig)
    # Per-arm, per-passage results are kept under <records_dir>/divergence/ (resumable).
    records_dir: str = "outputs/records"
    seed: int = 1234  # unused by prefill; engines read it

