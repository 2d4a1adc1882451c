"""Which parallelism settings belong in an arm's fingerprint.

Tensor parallelism changes the numbers (reductions split across GPUs; vLLM issue 23813 reports FP8
FlashAttention-3 accuracy moving with the TP size at long context), so `tensor_parallel_size` stays in.
Data parallelism only spreads requests over identical engine copies, and a replica pool only spreads them
over identical servers, so neither enters the fingerprint: records made with DP=1 and DP=8, or with one
replica and five, are the same arm and resume each other.
"""

from __future__ import annotations

from typing import Any

# vLLM EngineArgs that place or count data-parallel engine copies (and API server processes).
DATA_PARALLEL_ARGS = frozenset({
    "data_parallel_size", "data_parallel_size_local", "data_parallel_rank", "data_parallel_rank_local",
    "data_parallel_start_rank", "data_parallel_address", "data_parallel_rpc_port", "data_parallel_backend",
    "data_parallel_hybrid_lb", "data_parallel_external_lb", "headless", "api_server_count",
})


def fingerprint_view(describe: dict[str, Any]) -> dict[str, Any]:
    """An engine's describe() without the data-parallel placement args. Unchanged (the same object's
    content) when none is set, so configs without DP keep their fingerprints."""
    out = dict(describe)
    for key in ("engine_args", "declared_engine_args"):
        args = out.get(key)
        if isinstance(args, dict) and DATA_PARALLEL_ARGS.intersection(args):
            out[key] = {k: v for k, v in args.items() if k not in DATA_PARALLEL_ARGS}
    return out
