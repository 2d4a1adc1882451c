"""Load generators: `vllm bench serve` (the field's tool, default where vLLM is installed) and a minimal
built-in streaming client (for machines without vLLM: CI against the fake server).

Both return the same thing, a `Batch`: one `Sample` per request (input/output tokens, TTFT, every
inter-token gap, errors) and the wall time, so the sweep, the fits and the throughput figures never
depend on which one ran. Prompts are random token ids drawn per request (unique, so no request is a
prefix-cache hit), which also needs no tokenizer (dummy-weight models have none).
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fp8eval.engines.vllm.args import vllm_python
from fp8eval.engines.vllm.child import child_env

BENCH_MODULE = "fp8eval.perf.vllm_bench_main"  # `vllm bench serve` (see that module for why not the CLI)


class LoadError(RuntimeError):
    """The load generator could not run (message says why)."""


@dataclass
class Sample:
    input_len: int
    output_len: int
    ttft_ms: float | None
    itl_ms: list[float] = field(default_factory=list)
    e2e_ms: float | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        """Whether the request succeeded: no error and a first token arrived."""
        return not self.error and self.ttft_ms is not None


@dataclass
class Batch:
    client: str
    samples: list[Sample]
    duration_s: float
    concurrency: int
    raw_path: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)  # the generator's own figures (vllm bench)

    def to_json(self, with_samples: bool = True) -> dict[str, Any]:
        """The batch as JSON: client, duration, concurrency, request and error counts, raw file, and the samples unless
        `with_samples` is false."""
        out = {"client": self.client, "duration_s": round(self.duration_s, 4), "concurrency": self.concurrency,
               "n_requests": len(self.samples), "n_errors": sum(1 for s in self.samples if not s.ok),
               "raw_path": self.raw_path}
        if with_samples:
            out["samples"] = [asdict(s) for s in self.samples]
        return out


def token_prompts(lengths: list[int], vocab: int, rng: random.Random) -> list[list[int]]:
    """One random token-id prompt per length; ids avoid the first 1000 ids (special tokens)."""
    lo, hi = min(1000, vocab // 2), vocab - 1
    return [[rng.randint(lo, hi) for _ in range(n)] for n in lengths]


# -- built-in client ------------------------------------------------------------------------------------

async def _one(http, url: str, model: str, prompt: list[int], max_tokens: int) -> Sample:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    sample = Sample(input_len=len(prompt), output_len=0, ttft_ms=None)
    start = time.perf_counter()
    last = start
    try:
        async with http.stream("POST", url + "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                sample.error = f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}"
                return sample
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                now = time.perf_counter()
                if chunk.get("usage"):
                    sample.output_len = int(chunk["usage"].get("completion_tokens") or sample.output_len)
                if not chunk.get("choices"):
                    continue
                # One streamed chunk = one step of the engine (possibly several tokens); as vllm bench.
                if sample.ttft_ms is None:
                    sample.ttft_ms = (now - start) * 1000.0
                else:
                    sample.itl_ms.append((now - last) * 1000.0)
                last = now
        sample.e2e_ms = (last - start) * 1000.0
        if not sample.output_len:
            sample.output_len = len(sample.itl_ms) + (1 if sample.ttft_ms is not None else 0)
    except Exception as exc:  # noqa: BLE001 - one failed request is counted, not fatal
        sample.error = f"{type(exc).__name__}: {exc}"[:300]
    return sample


async def _run_builtin(url: str, model: str, prompts: list[list[int]], max_tokens: list[int],
                       concurrency: int, timeout_s: float) -> tuple[list[Sample], float]:
    import httpx

    slots = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=30.0), limits=limits) as http:
        async def guarded(p, m):
            async with slots:
                return await _one(http, url, model, p, m)

        start = time.perf_counter()
        samples = await asyncio.gather(*(guarded(p, m) for p, m in zip(prompts, max_tokens)))
        return list(samples), time.perf_counter() - start


def run_builtin(url: str, model: str, prompts: list[list[int]], max_tokens: list[int], concurrency: int,
                timeout_s: float = 1800.0) -> Batch:
    """Send the prompts with at most `concurrency` in flight; streamed, ignore_eos, greedy."""
    samples, duration = asyncio.run(_run_builtin(url.rstrip("/"), model, prompts, max_tokens, concurrency, timeout_s))
    return Batch("builtin", samples, duration, concurrency)


# -- vllm bench serve -----------------------------------------------------------------------------------

def bench_python() -> str:
    """The interpreter that runs `vllm bench serve`: FP8EVAL_VLLM_PYTHON when set, else this one."""
    return vllm_python()


def vllm_bench_available(python: str | None = None) -> bool:
    """True when `python -m vllm.entrypoints.cli.main bench serve` can run (vLLM's benchmark module found)."""
    python = python or bench_python()
    code = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('vllm.benchmarks.serve') else 1)"
    try:
        return subprocess.run([python, "-c", code], capture_output=True, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def vllm_bench_command(url: str, model: str, *, input_len: int, output_len: int, num_prompts: int,
                       concurrency: int, range_ratio: float, seed: int, result_dir: Path, result_name: str,
                       tokenizer: str | None, python: str | None = None) -> list[str]:
    """The `vllm bench serve` command line for one batch (random dataset, streamed completions)."""
    cmd = [python or bench_python(), "-m", BENCH_MODULE,
           "--backend", "vllm", "--base-url", url.rstrip("/"), "--endpoint", "/v1/completions",
           "--model", model, "--dataset-name", "random",
           "--random-input-len", str(input_len), "--random-output-len", str(output_len),
           "--random-range-ratio", str(range_ratio), "--num-prompts", str(num_prompts),
           "--max-concurrency", str(concurrency), "--request-rate", "inf", "--ignore-eos",
           "--seed", str(seed), "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--save-result", "--save-detailed", "--result-dir", str(result_dir),
           "--result-filename", result_name]
    cmd += ["--tokenizer", tokenizer] if tokenizer else ["--skip-tokenizer-init"]
    return cmd


def parse_vllm_bench(path: Path, concurrency: int) -> Batch:
    """A `--save-result --save-detailed` JSON of `vllm bench serve` -> Batch (seconds -> ms)."""
    data = json.loads(Path(path).read_text())
    ttfts = data.get("ttfts") or []
    itls = data.get("itls") or []
    ins = data.get("input_lens") or []
    outs = data.get("output_lens") or []
    errors = data.get("errors") or [""] * len(ins)
    samples = []
    for i in range(len(ins)):
        err = errors[i] if i < len(errors) else ""
        ttft = ttfts[i] if i < len(ttfts) else None
        gaps = itls[i] if i < len(itls) else []
        samples.append(Sample(
            input_len=int(ins[i]), output_len=int(outs[i] if i < len(outs) else 0),
            ttft_ms=None if (err or ttft in (None, 0)) else float(ttft) * 1000.0,
            itl_ms=[float(g) * 1000.0 for g in (gaps or [])],
            e2e_ms=None, error=str(err or "")))
    keep = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "output_throughput",
            "mean_ttft_ms", "median_ttft_ms", "mean_itl_ms", "median_itl_ms", "mean_tpot_ms", "median_tpot_ms")
    summary = {k: data[k] for k in keep if k in data}
    return Batch("vllm_bench", samples, float(data.get("duration") or 0.0), concurrency, str(path), summary)


def run_vllm_bench(url: str, model: str, *, input_len: int, output_len: int, num_prompts: int, concurrency: int,
                   range_ratio: float, seed: int, out_dir: Path, name: str, tokenizer: str | None,
                   timeout_s: float = 1800.0) -> Batch:
    """Run one `vllm bench serve` batch; its log and JSON stay in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = out_dir / f"{name}.json"
    cmd = vllm_bench_command(url, model, input_len=input_len, output_len=output_len, num_prompts=num_prompts,
                             concurrency=concurrency, range_ratio=range_ratio, seed=seed, result_dir=out_dir,
                             result_name=result.name, tokenizer=tokenizer)
    log = out_dir / f"{name}.log"
    env = child_env()
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    with open(log, "wb") as fh:
        try:
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=timeout_s,
                                check=False).returncode
        except subprocess.TimeoutExpired:
            raise LoadError(f"`vllm bench serve` ran past {timeout_s:.0f} s ({log})") from None
    if rc != 0 or not result.is_file():
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise LoadError(f"`vllm bench serve` failed (exit {rc}); last lines of {log}: " + " | ".join(tail))
    return parse_vllm_bench(result, concurrency)


def pick_client(wanted: str) -> str:
    """`auto`: vllm bench where vLLM's benchmark module is importable, else the built-in client."""
    if wanted not in ("auto", "vllm_bench", "builtin"):
        raise LoadError(f"perf.client={wanted!r}; valid: auto, vllm_bench, builtin")
    if wanted != "auto":
        return wanted
    return "vllm_bench" if vllm_bench_available() else "builtin"


__all__ = [
    "Batch",
    "LoadError",
    "Sample",
    "parse_vllm_bench",
    "pick_client",
    "run_builtin",
    "run_vllm_bench",
    "token_prompts",
    "vllm_bench_command",
]
