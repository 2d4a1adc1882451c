"""The reference engine's public probe: its loaded model under a chosen KV policy, per position.

    with engine.probe() as p:                  # the arm's own KV policy (engine.kv_policy)
        hidden = p.hidden(ids)                 # final hidden states [T, d] (numpy), chunked as generation prefills
        logits = p.logits(hidden[a:b])         # lm_head (and soft-capping) on a slice: [b - a, vocab] (torch)
    with engine.probe(policy) as p:            # any KVPolicy (per-layer formats: fp8eval.sensitivity)
        own = p.model_logits(ids)              # the model's own logits of every position, one forward [T, vocab]

What wings (divergence, sensitivity, pareto) use instead of the engine's private state: the policy is active for
the `with` block only (the one before it comes back after), the model is loaded on entry, and the prefill tokens
a probe runs are counted in the engine's `computed_prefill_tokens`. `decode_hidden(ids)` is the decode path
(issue 35): the first token alone, then one decode step per token, as generation computes them (in one pass).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np


class Probe:
    """Per-position hidden states and logits of token sequences through the engine's model under one KV policy."""

    def __init__(self, engine, model, device: str, chunk: int):
        self._engine, self._model, self._device, self._chunk = engine, model, device, max(1, int(chunk))

    @property
    def config(self):
        """The model's (transformers) config."""
        return self._model.config

    @property
    def architecture(self) -> str:
        """The model's class name (LlamaForCausalLM, ...)."""
        return type(self._model).__name__

    @property
    def vocab_size(self) -> int:
        """Rows of the output embedding: the width of every logit row."""
        return int(self._model.get_output_embeddings().weight.shape[0])

    def hidden(self, ids) -> np.ndarray:
        """The last hidden state (after the final norm) at every position of `ids`, one prefill in the engine's
        `prefill_chunk` chunks through the policy's emulated cache: [len(ids), hidden] float32."""
        import torch
        from transformers import DynamicCache

        x = torch.tensor([list(ids)], device=self._device)
        out = []
        with torch.inference_mode():
            cache = DynamicCache(config=self._model.config)
            for start in range(0, x.shape[1], self._chunk):
                h = self._model.model(input_ids=x[:, start:start + self._chunk], past_key_values=cache, use_cache=True)
                out.append(h.last_hidden_state[0].float().cpu())
                self._engine.computed_prefill_tokens += min(self._chunk, x.shape[1] - start)
        return torch.cat(out).numpy()

    def decode_hidden(self, ids, batch_lengths=None, stepwise: bool = False) -> np.ndarray:
        """The last hidden state at every position of `ids` as the decode path computes it: the first token alone, then
        one decode step per token through the policy's cache: [len(ids), hidden] float32. `python -m
        fp8eval.divergence divergence.path=decode`. `batch_lengths`: the lengths of the passages decoded together with
        this one (itself included; None: alone), which set FA3's split count at each step (fp8eval.engines.
        attention_emulation.fa3_num_splits), as vLLM's forced decoding of that batch runs it.

        With the passage forced, step p computes position p from the cache of positions 0..p-1, each written by its own
        step: one causal pass whose every query row is computed as its decode step computes it (the emulated kernel's
        decode tiles and split count per row, `KVPolicy.decode_live`) gives the same numbers without a step per token.
        Only the summation order of matrix products may differ (torch picks kernels by shape): the engine's own decode
        floor, not the kernel's, so a policy without a decode emulation (`kv.fa3_decode=false`, exact layers) gives its
        prefill path here. `stepwise=True` runs the step-per-token loop instead (what generation runs; tests compare)."""
        import dataclasses

        import torch

        from fp8eval.engines.reserved_cache import reserved_cache

        n = len(ids)
        lengths = [int(x) for x in (batch_lengths or [n])]
        live = tuple(max(1, sum(1 for m in lengths if m - 2 >= p)) for p in range(n))
        shared = self._engine._shared
        before = shared["active_policy"]
        shared["active_policy"] = dataclasses.replace(before, decode_live=live)
        try:
            if not stepwise:
                out = self.hidden(ids)
                self._engine.computed_prefill_tokens -= n - 1  # a forced decode prefills its first token only
                return out
            x = torch.tensor([list(ids)], device=self._device)
            rows = []
            with torch.inference_mode():
                cache = reserved_cache(self._model.config, x.shape[1])
                for i in range(x.shape[1]):
                    h = self._model.model(input_ids=x[:, i:i + 1], past_key_values=cache, use_cache=True)
                    rows.append(h.last_hidden_state[0, -1].float().cpu())
            self._engine.computed_prefill_tokens += 1
            return torch.stack(rows).numpy()
        finally:
            shared["active_policy"] = before

    def greedy_ids(self, ids, n: int) -> list[int]:
        """The greedy continuation of `n` tokens after `ids` (EOS ignored), computed as the engine's generation computes
        it (its `_prefill` in chunks into a cache with room for all, then its `_decode` steps), the argmax of each
        step (divergence.continuation=greedy)."""
        import torch

        out: list[int] = []
        with torch.inference_mode():
            cache, logits = self._engine._prefill(list(ids), len(ids) + int(n))
            while len(out) < int(n):
                out.append(int(logits[0].argmax()))
                if len(out) < int(n):
                    logits = self._engine._decode(cache, torch.tensor([[out[-1]]]))
        return out

    def logits(self, hidden: np.ndarray) -> Any:
        """lm_head (and the model's final logit soft-capping, if any) on a slice of hidden states (a torch tensor)."""
        import torch

        head = self._model.get_output_embeddings()
        h = torch.from_numpy(np.ascontiguousarray(hidden)).to(head.weight.device, head.weight.dtype)
        with torch.inference_mode():
            logits = head(h).float()
            cap = getattr(self._model.config, "final_logit_softcapping", None)
            if cap:
                logits = torch.tanh(logits / cap) * cap
        return logits

    def model_logits(self, ids) -> Any:
        """The model's own logits at every position of `ids` (one forward, no cache chunks): [len(ids), vocab]."""
        import torch

        with torch.inference_mode():
            return self._model(input_ids=torch.tensor([list(ids)], device=self._model.device)).logits[0]


@contextmanager
def open_probe(engine, policy=None) -> Iterator[Probe]:
    """`engine.probe(policy)`: the model loaded, `policy` (None: the arm's own) active for the block."""
    engine._load()
    shared = engine._shared
    before = shared.get("active_policy")
    shared["active_policy"] = engine._policy if policy is None else policy
    try:
        yield Probe(engine, engine._model, engine._device_name(), engine.cfg.engine.prefill_chunk)
    finally:
        shared["active_policy"] = before
