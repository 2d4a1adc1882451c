"""Prefill passes of the reference engine's model under different KV policies, compared with BF16.

One model is loaded (the arms share it, as in `python -m fp8eval`); a pass runs the engine's public probe under
a `KVPolicy` (which layers store FP8: `engine.probe(policy)`, the prefill the divergence probe runs), keeping
only the final hidden states. Distributions and measures are the probe's: logits from the hidden
states a slice of positions at a time, KL(bf16 || variant), top-1 agreement, |delta logprob| of the BF16
argmax, pooled per position bucket (`fp8eval.divergence.measures`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fp8eval.divergence import measures as M
from fp8eval.divergence.documents import Passage, passages
from fp8eval.engines import capabilities, resolve_kind
from fp8eval.engines.base import EngineError
from fp8eval.engines.kvcache import KVPolicy
from fp8eval.engines.spec import ArmSpec


class SensitivityError(EngineError):
    """The sensitivity run cannot proceed; the message says why and what to do."""


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

    def __init__(self, cfg, door, arms: list[ArmSpec]):
        """`arms` as `fp8eval.arms.resolve_arms` gives them ([baseline, variant], or one arm), opened through
        `door` (an `fp8eval.arms.ArmEngines`: both engines share one loaded model)."""
        if not capabilities(cfg).switches_kv_policy:
            raise SensitivityError(
                f"python -m fp8eval.sensitivity needs an engine that switches each layer's cache format between "
                f"passes (engine=reference); engine={cfg.engine.kind} resolved to {resolve_kind(cfg)}, which "
                f"cannot. Evaluate its recommended skip list on any engine with "
                f"`python -m fp8eval ... kv.engine_args.kv_cache_dtype_skip_layers=[...]`.")
        self.engine = door.open(arms[-1])
        base = door.open(arms[0])
        if self.engine.cache_dtype in ("auto", "bfloat16"):
            raise SensitivityError(f"kv={cfg.kv.name} keeps a {self.engine.cache_dtype} cache: nothing to rank. "
                                   f"Use an FP8 kv option (kv=fp8, fp8_e5m2, fp8_calibrated, fp8_per_head).")
        self.ignored_skip = list(self.engine.skip_layers)
        self.path = str(getattr(getattr(cfg, "sensitivity", None), "path", "prefill"))
        self.tokenizer = self.engine.tokenizer()
        self.arm: KVPolicy = dataclasses.replace(self.engine.kv_policy, skip_layers=())
        self.bf16: KVPolicy = base.kv_policy
        with self.engine.probe() as probe:
            self.config, self.architecture = probe.config, probe.architecture
            self.vocab = probe.vocab_size
        text = self.config.get_text_config()
        self.n_layers = int(text.num_hidden_layers)
        self.types = layer_types(self.config, self.n_layers)

    # --- policies ---------------------------------------------------------------------------------------
    def fp8_policy(self, skip) -> KVPolicy:
        """The arm's format and scales with `skip` (layer indices, or "sliding_window") kept in BF16."""
        return dataclasses.replace(self.arm, skip_layers=tuple(str(x) for x in skip))

    def only(self, layer: int) -> KVPolicy:
        """The policy with only `layer` in FP8 (every other layer kept in BF16)."""
        return self.fp8_policy([i for i in range(self.n_layers) if i != layer])

    # --- passes -----------------------------------------------------------------------------------------
    def passages(self, documents: int, lengths: list[int]) -> list[Passage]:
        """`documents` passages of each of `lengths` tokens, tokenized with the model's tokenizer (SensitivityError when
        the books cannot provide them)."""
        try:
            return passages(self.tokenizer, sorted(set(int(n) for n in lengths)), documents)
        except ValueError as e:
            raise SensitivityError(str(e)) from e

    def hidden(self, policy: KVPolicy, ids) -> np.ndarray:
        """Final hidden states [T, hidden] of one pass with `policy` as every layer's cache: one prefill, or decode steps
        (sensitivity.path=decode)."""
        with self.engine.probe(policy) as probe:
            return probe.hidden(tuple(ids)) if self.path == "prefill" else probe.decode_hidden(tuple(ids))

    def logits(self, hidden: np.ndarray):
        """Logits of a slice of final hidden states (the model's lm_head, soft-capping included)."""
        with self.engine.probe() as probe:
            return probe.logits(hidden)

    def check_head(self, ids) -> None:
        """The probe's hidden-state logits must be the model's own (a model with extra logit scaling
        would need handling there); checked once on a short prefix."""
        import torch

        x = list(ids)[:16]
        with self.engine.probe(self.bf16) as probe:
            ref = probe.model_logits(x)
            mine = probe.logits(probe.hidden(x))
        # float32 compute agrees to rounding; bfloat16 logits step by 1/16 around 10, so allow a few steps
        # there (a forgotten soft-cap or logit scale is off by far more).
        tol = 1e-3 if ref.dtype == torch.float32 else 0.25
        if not torch.allclose(ref.float().cpu(), mine.float().cpu(), atol=tol, rtol=tol):
            raise SensitivityError(f"{self.architecture}: logits from the final hidden states "
                                   f"differ from the model's own (max {float((ref.cpu() - mine.cpu()).abs().max()):.3g})")


class Baseline:
    """The BF16 arm's logits for one passage, a slice of positions at a time: kept in memory when the
    whole passage fits `keep_gib`, else made again from the hidden states for every comparison."""

    def __init__(self, passes: Passes, hidden: np.ndarray, keep_gib: float):
        self.passes, self.hidden = passes, hidden
        self.step = slice_step(passes.vocab)
        self.keep = hidden.shape[0] * passes.vocab * 4 <= keep_gib * 2**30
        self._slices: dict[int, object] = {}

    def slice(self, start: int):
        """The BF16 logits of positions start..start+step, from memory when kept, else made again."""
        if start in self._slices:
            return self._slices[start]
        logits = self.passes.logits(self.hidden[start:start + self.step])
        if self.keep:
            self._slices[start] = logits
        return logits

    def release(self) -> None:
        """Drop the kept logit slices."""
        self._slices.clear()


def slice_step(vocab: int) -> int:
    """Positions per slice of logits (~16M logits a slice, as the probe does)."""
    return max(16, (1 << 24) // vocab)


def measure(passes: Passes, base: Baseline, h_var: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per position: KL(bf16 || variant), top-1 agreement and |delta logprob| of the BF16 argmax, as arrays
    (what a passage's results file keeps; `replay` adds them to accumulators)."""
    parts = []
    for start in range(0, h_var.shape[0], base.step):
        lb = base.slice(start)
        lv = passes.logits(h_var[start:start + base.step])
        parts.append(tuple(M._as_np(x) for x in (M.kl_from_logits(lb, lv), M.top1_from_logits(lb, lv),
                                                  M.dlogp_from_logits(lb, lv))))
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))  # type: ignore[return-value]


def replay(measured, step: int, *into: M.BucketAccumulator) -> None:
    """Add measured per-position arrays to each accumulator a slice of `step` positions at a time: the
    same additions, in the same order, as measuring them did (so a resumed run sums to the same floats)."""
    kl, top1, dlogp = measured
    for start in range(0, len(kl), step):
        end = min(start + step, len(kl))
        for acc in into:
            acc.add(np.arange(start, end), kl[start:end], top1[start:end], dlogp[start:end])


def compare(passes: Passes, base: Baseline, h_var: np.ndarray, *into: M.BucketAccumulator) -> None:
    """Add, per position, KL(bf16 || variant), top-1 agreement and |delta logprob| of the BF16 argmax to
    each accumulator (several passages pool token-weighted, as the probe pools them)."""
    replay(measure(passes, base, h_var), base.step, *into)
