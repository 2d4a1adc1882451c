"""Benchmark 2, one prefill for all repeats: computed prefill tokens for one prompt sampled k times.

    python benchmarks/prefill.py --engine reference                  # embedded model, in-process
    python benchmarks/prefill.py --engine vllm --cfg engine=vllm_cpu # needs the vllm engines (branch vllm)
    python benchmarks/prefill.py --engine reference --tokens 64 --k 2   # smoke size

Sends one Request with n=k (what the runner sends for `task.repeats=k`) whose prompt is at least
--tokens tokens, and counts the prompt tokens the engine actually computed:
- reference: its `computed_prefill_tokens` counter (tokens run through the model in prefill);
- vllm (offline): sum over the request's outputs of prompt tokens - cached tokens (`computed_prompt_tokens`
  in Completion.extra);
- server: delta of `vllm:prompt_tokens_total - vllm:prefix_cache_hits_total` on /metrics (vLLM counts the
  prompt once per sequence, so the prompt-token counter alone overstates the work k-fold).
Target: computed <= 1.05 x prompt tokens + (k - 1) x KV block size.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ")


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from fp8eval.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_object(hydra_compose(config_name="config", overrides=overrides))


def metric_total(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))


def server_computed(engine) -> float | None:
    """prompt_tokens_total - prefix_cache_hits_total from the server's /metrics, or None when unexposed."""
    try:
        text = engine._get("/metrics").text  # noqa: SLF001 - the server engine's own HTTP helper
    except Exception:  # noqa: BLE001
        return None
    return metric_total(text, "vllm:prompt_tokens_total") - metric_total(text, "vllm:prefix_cache_hits_total")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="reference", choices=["reference", "vllm", "server"])
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=4096, help="prompt length to reach, at least")
    ap.add_argument("--block-size", type=int, default=16, help="KV block size for the target (vLLM's default)")
    ap.add_argument("--cfg", nargs="*", default=[], help="more config overrides (model=..., engine=...)")
    args = ap.parse_args()

    from fp8eval.engines import ENGINES, build_engine
    from fp8eval.engines.base import Request

    if args.engine not in ENGINES:
        print(json.dumps({"engine": args.engine, "status": f"unrun: engine={args.engine} is not registered on "
                                                            f"this branch (fp8eval.engines.ENGINES)"}))
        return
    overrides = [f"engine={args.engine}", "model=smollm2-135m", *args.cfg]
    cfg = compose(overrides)
    engine = build_engine(cfg, cfg.kv, {})
    try:
        text = FILLER
        make = lambda t: Request(id="prefill", messages=({"role": "user", "content": t + "\nWhat colour is the sky?"},),  # noqa: E731
                                 n=args.k, seeds=tuple(range(args.k)), sampling={"temperature": 1.0, "max_tokens": 4})
        # grow the prompt to the asked length, counted with the engine's own tokenizer and template
        while engine.count_prompt_tokens(make(text)) < args.tokens:
            text *= 2
        req = make(text)
        prompt_tokens = engine.count_prompt_tokens(req)
        before = server_computed(engine) if args.engine == "server" else None
        t0 = time.perf_counter()
        comps = list(engine.generate([req]))
        seconds = time.perf_counter() - t0
        comp = comps[0]
        if args.engine == "reference":
            computed = engine.computed_prefill_tokens
        elif args.engine == "server":
            after = server_computed(engine)
            computed = after - before if after is not None and before is not None else None
        else:
            computed = comp.extra.get("computed_prompt_tokens")
        bound = 1.05 * prompt_tokens + (args.k - 1) * args.block_size
        print(json.dumps({
            "engine": args.engine, "k": args.k, "prompt_tokens": prompt_tokens,
            "computed_prefill_tokens": computed, "naive_k_prefills": args.k * prompt_tokens,
            "bound": bound, "met": computed is not None and computed <= bound,
            "cached_prompt_tokens": comp.cached_prompt_tokens, "choices": len(comp.choices),
            "seconds": round(seconds, 2),
        }))
    finally:
        engine.close()


if __name__ == "__main__":
    main()
