"""Prefill passes of the reference engine's model under different KV policies, compared with BF16.

One model is loaded (the arms share it, as in `python -m fp8eval`); a pass swaps the active `KVPolicy`
(which layers store FP8) and runs the decoder over a document prefix. Next-token distributions are made
from the final hidden states a chunk of positions at a time, so a 262k-token vocabulary never needs a
[positions x vocab] tensor for the whole prefix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from fp8eval.config import KVConfig
from fp8eval.engines import build_engine, resolve_kind
from fp8eval.engines.base import EngineError
from fp8eval.engines.kvcache import KVPolicy
from fp8eval.haystack import BOOKS, HAYSTACK_DIR, book_body
from fp8eval.sensitivity import measures

POSITION_CHUNK = 512  # positions per lm_head call


class SensitivityError(EngineError):
    """The sensitivity run cannot proceed; the message says why and what to do."""


@dataclass
class Unit:
    """One document prefix: every configuration is measured on each."""

    doc: int
    length: int
    ids: torch.Tensor  # [1, length]
    collect_stats: bool  # the longest prefix of its document collects the K/V statistics

    @property
    def label(self) -> str:
        return f"{BOOKS[self.doc].removesuffix('.txt')}@{self.length}"


@dataclass
class BucketSums:
    """Sums per position bucket, so documents and lengths pool token-weighted."""

    edges: list[int]
    sums: dict[str, list[float]] = field(default_factory=dict)  # label -> [kl, top1, dlogp, n]

    def add(self, kl: torch.Tensor, top1: torch.Tensor, dlogp: torch.Tensor, start: int) -> None:
        pos = torch.arange(start, start + kl.numel())
        for label, lo, hi in measures.bucket_ranges(self.edges, start + kl.numel()):
            m = (pos >= lo) & (pos < hi)
            if not bool(m.any()):
                continue
            s = self.sums.setdefault(label, [0.0, 0.0, 0.0, 0.0])
            s[0] += float(kl[m].double().sum())
            s[1] += float(top1[m].double().sum())
            s[2] += float(dlogp[m].double().sum())
            s[3] += float(m.sum())

    def merge(self, other: "BucketSums") -> None:
        for label, s in other.sums.items():
            mine = self.sums.setdefault(label, [0.0, 0.0, 0.0, 0.0])
            for j in range(4):
                mine[j] += s[j]

    def table(self) -> dict[str, dict[str, float]]:
        """{bucket: {kl_mean, top1_agree, dlogp_mean, n_tokens}} in position order."""
        order = [lab for lab, _, _ in measures.bucket_ranges(self.edges, 1 << 62)]
        return {lab: _means(self.sums[lab]) for lab in order if lab in self.sums}

    def overall(self) -> dict[str, float]:
        tot = [sum(s[j] for s in self.sums.values()) for j in range(4)]
        return _means(tot)


def _means(s: list[float]) -> dict[str, float]:
    n = s[3]
    return {"kl_mean": s[0] / n if n else float("nan"), "top1_agree": s[1] / n if n else float("nan"),
            "dlogp_mean": s[2] / n if n else float("nan"), "n_tokens": int(n)}


def layer_types(config, n_layers: int) -> list[str]:
    """Attention type per layer as transformers names them (`sliding_attention`, `full_attention`)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if types and len(types) == n_layers:
        return [str(t) for t in types]
    # No per-layer list: one window for every layer, unless the config switches it off (Qwen2 style).
    sliding = getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True)
    return ["sliding_attention" if sliding else "full_attention"] * n_layers


class Passes:
    """The loaded model, the BF16 and arm policies, and prefill passes under any skip list."""

    def __init__(self, cfg, baseline_kv: KVConfig, threads: int | None = None):
        if resolve_kind(cfg) != "reference":
            raise SensitivityError(
                f"python -m fp8eval.sensitivity runs on the reference engine (engine=reference), which can "
                f"switch each layer's cache format between passes; engine={cfg.engine.kind} resolved to "
                f"{resolve_kind(cfg)}. Evaluate its recommended skip list on any engine with "
                f"`python -m fp8eval ... kv.engine_args.kv_cache_dtype_skip_layers=[...]`.")
        shared: dict = {}
        self.variant = build_engine(cfg, cfg.kv, shared)
        self.base = build_engine(cfg, baseline_kv, shared)
        if self.variant.cache_dtype in ("auto", "bfloat16"):
            raise SensitivityError(f"kv={cfg.kv.name} keeps a {self.variant.cache_dtype} cache: nothing to rank. "
                                   f"Use an FP8 kv option (kv=fp8, fp8_e5m2, fp8_calibrated, fp8_per_head).")
        self.ignored_skip = list(self.variant.skip_layers)
        self.variant._load()
        self.base._load()
        self.shared = shared
        self.model = self.variant._model
        self.tokenizer = self.variant.tokenizer()
        self.arm: KVPolicy = dataclasses.replace(self.variant._policy, skip_layers=())
        self.bf16: KVPolicy = self.base._policy
        text = self.model.config.get_text_config()
        self.n_layers = int(text.num_hidden_layers)
        self.types = layer_types(self.model.config, self.n_layers)
        self.device = next(self.model.parameters()).device
        self.softcap = getattr(text, "final_logit_softcapping", None)

    # --- policies ---------------------------------------------------------------------------------------
    def fp8_policy(self, skip: list[int] | tuple[str, ...]) -> KVPolicy:
        """The arm's format and scales with `skip` (layer indices, or "sliding_window") kept in BF16."""
        return dataclasses.replace(self.arm, skip_layers=tuple(str(x) for x in skip))

    def only(self, layer: int) -> KVPolicy:
        return self.fp8_policy([i for i in range(self.n_layers) if i != layer])

    # --- documents --------------------------------------------------------------------------------------
    def units(self, documents: int, lengths: list[int]) -> list[Unit]:
        if documents > len(BOOKS):
            raise SensitivityError(f"sensitivity.documents={documents}: only {len(BOOKS)} books ship")
        longest = max(lengths)
        out = []
        for d in range(documents):
            text = book_body(str(HAYSTACK_DIR / BOOKS[d]))
            ids = self.tokenizer(text[: longest * 12], add_special_tokens=True)["input_ids"]
            if len(ids) < longest:
                raise SensitivityError(f"{BOOKS[d]} has {len(ids)} tokens, fewer than sensitivity.lengths "
                                       f"max {longest}")
            for n in sorted(set(int(x) for x in lengths)):
                out.append(Unit(d, n, torch.tensor([ids[:n]], device=self.device), collect_stats=n == longest))
        return out

    # --- passes -----------------------------------------------------------------------------------------
    def hidden(self, policy: KVPolicy, ids: torch.Tensor) -> torch.Tensor:
        """Final hidden states [T, hidden] of one prefill with `policy` as every layer's cache."""
        self.shared["active_policy"] = policy
        with torch.inference_mode():
            out = self.model.get_decoder()(input_ids=ids, use_cache=False)
        return out.last_hidden_state[0]

    def logprobs(self, h: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            logits = self.model.get_output_embeddings()(h).float()
            if self.softcap:
                logits = torch.tanh(logits / self.softcap) * self.softcap
            return torch.log_softmax(logits, dim=-1)

    def check_head(self, ids: torch.Tensor) -> None:
        """The decoder + lm_head path must give the model's own logits (a model with extra logit
        scaling would need handling here); checked once on a short prefix."""
        ids = ids[:, :16]
        self.shared["active_policy"] = self.bf16
        with torch.inference_mode():
            ref = torch.log_softmax(self.model(input_ids=ids, use_cache=False).logits[0].float(), dim=-1)
        mine = self.logprobs(self.hidden(self.bf16, ids))
        if not torch.allclose(ref, mine, atol=1e-4, rtol=1e-4):
            raise SensitivityError(f"{type(self.model).__name__}: log-probs from the decoder's hidden states "
                                   f"differ from the model's own (max {float((ref - mine).abs().max()):.3g})")


class Baseline:
    """The BF16 arm's distributions for one unit: kept in memory when small, else recomputed."""

    def __init__(self, passes: Passes, h: torch.Tensor, keep_gib: float):
        self.passes, self.h = passes, h
        vocab = passes.model.get_output_embeddings().weight.shape[0]
        self.keep = h.shape[0] * vocab * 4 <= keep_gib * 2**30
        self._chunks: dict[int, torch.Tensor] = {}

    def chunk(self, start: int) -> torch.Tensor:
        if start in self._chunks:
            return self._chunks[start]
        lp = self.passes.logprobs(self.h[start:start + POSITION_CHUNK])
        if self.keep:
            self._chunks[start] = lp
        return lp


def compare(passes: Passes, base: Baseline, h_var: torch.Tensor, edges: list[int]) -> BucketSums:
    """Per position bucket: KL(bf16 || variant), top-1 agreement, |delta logprob| of the BF16 argmax."""
    out = BucketSums(edges)
    for start in range(0, h_var.shape[0], POSITION_CHUNK):
        lp_b = base.chunk(start)
        lp_v = passes.logprobs(h_var[start:start + POSITION_CHUNK])
        kl, top1, dlogp = measures.per_position(lp_b, lp_v)
        out.add(kl, top1, dlogp, start)
    return out
