"""A KV cache that reserves its room once: transformers' DynamicCache with each full-attention layer writing new
positions into a buffer allocated for the whole request (prompt + max_tokens) instead of concatenating the cache
with every new token (which copied the whole cache, every layer, every decode step: ~40 % of a decode step of
the embedded SmolLM2 at 2k tokens of context).

What attention sees is the same: the cached positions followed by the new ones, as a view of the buffer, with the
same values (the reference engine's KV policy still rounds the new positions in place, fp8eval.engines.kvcache).
Anything that replaced a layer's tensors behind its back (batch_repeat_interleave, crop, reorder) is noticed at
the next update and the buffer rebuilt from them.

The values' buffer has one more column, all ones: exact attention multiplies P by V with a column of ones appended
(the row sums come out of the same product, fp8eval.engines.attention_emulation), which it finds here as a view
(the values' attribute V_WITH_ONES) instead of concatenating the whole V with ones at every call.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from fp8eval.engines.attention_emulation import V_WITH_ONES


class ReservedLayer(DynamicLayer):
    """A DynamicLayer whose keys/values are views of a buffer with room for `capacity` positions (grown by
    doubling if a request goes past it)."""

    def __init__(self, capacity: int, **kwargs):
        super().__init__(**kwargs)
        self.capacity = max(1, int(capacity))
        self._k_buf: torch.Tensor | None = None
        self._v_buf: torch.Tensor | None = None

    def _is_view_of_buffer(self) -> bool:
        buf = self._k_buf
        return (buf is not None and self.keys is not None and self.keys.dim() == 4
                and self.keys.data_ptr() == buf.data_ptr() and self.keys.shape[0] == buf.shape[0]
                and self.values.data_ptr() == self._v_buf.data_ptr() and self.values.shape[0] == buf.shape[0])

    def _rebuild(self, length: int, new: torch.Tensor, new_v: torch.Tensor) -> None:
        """A buffer with room for `length` positions, holding the current keys/values (if any)."""
        cur = self.get_seq_length()
        cap = max(self.capacity, length)
        shape_k = (*new.shape[:-2], cap, new.shape[-1])
        dv = new_v.shape[-1]
        shape_v = (*new_v.shape[:-2], cap, dv + 1)  # V and a column of ones
        k_buf = torch.empty(shape_k, dtype=new.dtype, device=new.device)
        v_buf = torch.empty(shape_v, dtype=new_v.dtype, device=new_v.device)
        v_buf[..., dv].fill_(1)
        if cur:
            k_buf[..., :cur, :].copy_(self.keys)
            v_buf[..., :cur, :dv].copy_(self.values)
        self._k_buf, self._v_buf, self.capacity = k_buf, v_buf, cap
        self._set_views(cur)

    def _set_views(self, end: int) -> None:
        """keys/values: the buffers' first `end` positions; the values carry their ones-column view (V_WITH_ONES)."""
        dv = self._v_buf.shape[-1] - 1
        self.keys, self.values = self._k_buf[..., :end, :], self._v_buf[..., :end, :dv]
        setattr(self.values, V_WITH_ONES, self._v_buf[..., :end, :])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the new positions after the cached ones; return the cached and new positions (views)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        cur = self.get_seq_length()
        end = cur + key_states.shape[-2]
        if not self._is_view_of_buffer() or end > self.capacity:
            grow = self.capacity if end <= self.capacity else max(end, 2 * self.capacity)
            self._rebuild(grow, key_states, value_states)
        self._k_buf[..., cur:end, :].copy_(key_states)
        self._v_buf[..., cur:end, :-1].copy_(value_states)
        self._set_views(end)
        return self.keys, self.values


def reserved_cache(config, capacity: int):
    """A DynamicCache for `config` whose full-attention layers are ReservedLayers with room for `capacity` positions
    (sliding-window and other layer kinds stay as transformers makes them)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    layers = getattr(cache, "layers", None)
    if layers:
        for i, layer in enumerate(layers):
            if type(layer) is DynamicLayer:
                layers[i] = ReservedLayer(capacity)
    return cache
