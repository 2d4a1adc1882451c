"""torch.compile and CUDA graphs chosen by the workload (`engine.cuda_graphs`: auto | on | off; issue 34).

Compile and CUDA-graph capture cost tens of seconds per vLLM start and pay back a few milliseconds per decode step.
`auto` runs eager (`enforce_eager=true`) when an arm's longest answer, `max_tokens` decode steps, is at most
EAGER_MAX_STEPS, and compiled otherwise. Both arms of a run get the same mode (the same sampling), and the mode is an
engine arg, so it is in every arm's fingerprint. An explicit `enforce_eager` or `compilation_config` always wins.
"""

from __future__ import annotations

from typing import Any

from fp8eval.config import effective_sampling
from fp8eval.engines.base import EngineError

# Eager decode costs a few milliseconds more per step than CUDA graphs on an H200 for small models; capture and
# compile cost ~25 s (warm) to ~100 s (cold) per engine start. Break-even is a few thousand steps.
EAGER_MAX_STEPS = 2048


def graphs_args(cfg, args: dict[str, Any]) -> dict[str, Any]:
    """`enforce_eager` as `engine.cuda_graphs` decides it (module docstring); {} when the args already say."""
    mode = str(getattr(cfg.engine, "cuda_graphs", "auto") or "auto")
    if mode not in ("auto", "on", "off"):
        raise EngineError(f"engine.cuda_graphs={mode!r}: use auto, on or off")
    if "enforce_eager" in args or "compilation_config" in args:
        return {}
    if mode == "on":
        return {"enforce_eager": False}
    if mode == "off":
        return {"enforce_eager": True}
    try:
        steps = int(effective_sampling(cfg)["max_tokens"])  # the longest answer: its decode steps
    except (AttributeError, TypeError, ValueError):  # a config without the model/task layers (a wing's own)
        return {}
    return {"enforce_eager": True} if steps <= EAGER_MAX_STEPS else {}
