"""`python -m fp8eval.knobaudit`: the knob audit outside a scored run.

    python -m fp8eval.knobaudit start --out R.json model=qwen3-30b kv=fp8 engine=vllm model.dummy=true
        start the arm's engine, audit it (problems are recorded, not fatal, unless --strict), print its KV
        capacity (vLLM's "KV cache size: N tokens"), serve one request, write one JSON object
    python -m fp8eval.knobaudit corpus DIR --out R.json [--engine vllm|vllm_cpu|reference] [engine overrides]
        build the regression corpus (fp8eval.knobaudit.corpus) under DIR and check each case is caught
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

_CAPACITY = re.compile(r"KV cache size:\s*([\d,]+)\s*tokens")


def capacity_tokens(log_text: str) -> int | None:
    """vLLM's start-up KV capacity ("GPU KV cache size: N tokens"; the CPU build says "CPU KV cache size")."""
    found = _CAPACITY.findall(log_text or "")
    return int(found[-1].replace(",", "")) if found else None


def start(overrides: list[str], strict: bool) -> dict:
    """Start one arm, audit it, read its capacity, serve one request."""
    from fp8eval.arms import arm_spec, open_engines
    from fp8eval.config import KVConfig
    from fp8eval.engines.base import Request
    from fp8eval.knobaudit.check import compose

    cfg = compose(overrides if strict else overrides + ["audit.allow=[dtype,scales,backend,skip]"])
    kv = cfg.kv if isinstance(cfg.kv, KVConfig) else cfg.kv
    out: dict = {"model": cfg.model.name, "kv": kv.name, "overrides": overrides, "started": False}
    t0 = time.monotonic()
    try:
        with open_engines(cfg) as door, door.engine(arm_spec(cfg, kv)) as engine:
            out.update(started=True, start_s=round(time.monotonic() - t0, 1))
            out["audit"] = engine.knob_audit
            pre = engine.preflight or {}
            out["preflight"] = {k: pre.get(k) for k in ("vllm_version", "cache_dtype", "attention_backend",
                                                         "max_model_len", "model", "device_name",
                                                         "loaded_scales_sha256", "audit_allowed")}
            out["capacity_tokens"] = capacity_tokens(engine.startup_log)
            req = Request(id="knobaudit-0", messages=({"role": "user", "content": "Say hello."},), n=1, seeds=(0,),
                          sampling={"max_tokens": 8, "temperature": 0.0}, chat_template_kwargs={})
            t1 = time.monotonic()
            completion = next(iter(engine.generate([req])))
            out["request"] = {"ok": True, "latency_s": round(time.monotonic() - t1, 3),
                              "prompt_tokens": completion.prompt_tokens,
                              "output_tokens": completion.choices[0].output_tokens,
                              "finish_reason": completion.choices[0].finish_reason}
    except Exception as e:  # noqa: BLE001 - recorded in the table; the next arm still runs
        out["error"] = f"{type(e).__name__}: {e}"[:1500]
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out


def corpus(root: Path, engine: str, overrides: list[str]) -> dict:
    """Build the corpus under `root` and run every case on `engine`; each case says whether it was caught."""
    from fp8eval.knobaudit import corpus as corpus_mod
    from fp8eval.knobaudit.check import check_case

    results = []
    for case, d in corpus_mod.build(root):
        results.append(check_case(case, d, engine, overrides))
        print(json.dumps(results[-1])[:600], file=sys.stderr)
    return {"engine": engine, "cases": results, "all_caught": all(r["caught"] for r in results)}


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    p = argparse.ArgumentParser(prog="python -m fp8eval.knobaudit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start one arm, audit, capacity, one request")
    s.add_argument("--out", type=Path)
    s.add_argument("--strict", action="store_true", help="a mismatch fails the start (as in a scored run)")
    s.add_argument("overrides", nargs="*")
    c = sub.add_parser("corpus", help="build and check the regression corpus")
    c.add_argument("dir", type=Path)
    c.add_argument("--out", type=Path)
    c.add_argument("--engine", default="vllm", choices=["vllm", "vllm_cpu", "reference"])
    c.add_argument("overrides", nargs="*", help="engine.engine_args.* overrides (vllm)")
    a = p.parse_args(argv)
    if a.cmd == "start":
        result = start(a.overrides, a.strict)
        ok = result.get("started") and "error" not in result
    else:
        result = corpus(a.dir, a.engine, a.overrides)
        ok = result["all_caught"]
    text = json.dumps(result, indent=1, default=str)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
