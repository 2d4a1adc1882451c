"""`python -m fp8eval.perf`: per arm, the ITL/TTFT sweep at concurrency 1 and the throughput batch; then
the fits, break-even, capacity gain, perf.json, plots and the table."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fp8eval.arms import ArmEngines, open_engines, resolve_arms
from fp8eval.core.secrets import redact, redact_obj
from fp8eval.perf import analysis
from fp8eval.perf.arms import Arm, model_vocab, open_arm, perf_cfg
from fp8eval.perf.client import (
    Batch,
    LoadError,
    pick_client,
    run_builtin,
    run_vllm_bench,
    token_prompts,
)
from fp8eval.perf.fake_server import LatencyLaw, fake_server_process

PERF_SCHEMA = 1
PROBE_ITL_MS, PROBE_TTFT_MS = 2.0, 10.0


class Measurer:
    """Sends one batch to a server with the chosen load generator."""

    def __init__(self, client: str, out_dir: Path, seed: int, vocab: int, timeout_s: float):
        self.client, self.out_dir, self.seed, self.vocab, self.timeout_s = client, out_dir, seed, vocab, timeout_s
        self.rng = random.Random(seed)
        self.calls = 0

    def batch(self, url: str, model: str, tokenizer: str | None, *, input_len: int, output_len: int, n: int,
              concurrency: int, jitter: float = 0.0, name: str) -> Batch:
        """Send `n` requests of about input_len/output_len tokens (±jitter) at `concurrency` and return the measured
        Batch, with `vllm bench serve` or the built-in client."""
        self.calls += 1
        if self.client == "vllm_bench":
            return run_vllm_bench(url, model, input_len=input_len, output_len=output_len, num_prompts=n,
                                  concurrency=concurrency, range_ratio=jitter, seed=self.seed + self.calls,
                                  out_dir=self.out_dir, name=name, tokenizer=tokenizer, timeout_s=self.timeout_s)
        ins = [self._jitter(input_len, jitter) for _ in range(n)]
        outs = [self._jitter(output_len, jitter) for _ in range(n)]
        return run_builtin(url, model, token_prompts(ins, self.vocab, self.rng), outs, concurrency, self.timeout_s)

    def _jitter(self, value: int, jitter: float) -> int:
        if jitter <= 0:
            return value
        return max(1, self.rng.randint(int(value * (1 - jitter)), int(value * (1 + jitter))))


def measure_arm(arm: Arm, m: Measurer, p, log: Callable[[str], None]) -> dict[str, Any]:
    """The sweep (after discarded warm-up requests) and the throughput batch of one arm."""
    out: dict[str, Any] = {"server": arm.server, "kv_capacity": arm.capacity,
                           "kv_capacity_tokens": arm.capacity.get("tokens"), "max_model_len": arm.max_model_len}
    max_input = p.max_input or (arm.max_model_len - p.sweep_output_tokens - 64)
    lengths = list(p.lengths) if p.lengths else analysis.sweep_lengths(p.min_input, max_input, p.sweep_points)
    too_long = [n for n in lengths if n + p.sweep_output_tokens > arm.max_model_len]
    if too_long:
        log(f"[perf] {arm.name}: {len(too_long)} sweep length(s) do not fit max_model_len {arm.max_model_len} "
            f"and are skipped: {too_long}")
    lengths = [n for n in lengths if n not in too_long]
    out["skipped_lengths"] = too_long
    if p.warmup_requests > 0:
        w = m.batch(arm.url, arm.model_id, arm.tokenizer, input_len=lengths[0], output_len=p.sweep_output_tokens,
                    n=p.warmup_requests, concurrency=1, name=f"{arm.name}-warmup")
        out["warmup"] = {"requests": len(w.samples), "n_errors": sum(1 for s in w.samples if not s.ok),
                         "discarded": True}
    points = []
    for n in lengths:
        t0 = time.monotonic()
        b = m.batch(arm.url, arm.model_id, arm.tokenizer, input_len=n, output_len=p.sweep_output_tokens,
                    n=p.sweep_requests, concurrency=1, name=f"{arm.name}-sweep-{n}")
        pt = analysis.point(b)
        pt["requested_input_tokens"] = n
        points.append(pt)
        log(f"[perf] {arm.name}: input {n:>7} ITL {pt['itl_ms']} ms TTFT {pt['ttft_ms']} ms "
            f"({pt['n']} ok, {pt['n_errors']} errors, {time.monotonic() - t0:.1f} s)")
    out["points"] = points
    out["itl_fit"] = analysis.itl_fit(points)
    out["ttft_fit"] = analysis.ttft_fit(points)
    if p.throughput and p.throughput_requests > 0:
        tin, tout, scale = analysis.throughput_shape(p.throughput_input, p.throughput_output, p.throughput_jitter,
                                                     arm.max_model_len)
        t0 = time.monotonic()
        b = m.batch(arm.url, arm.model_id, arm.tokenizer, input_len=tin, output_len=tout, n=p.throughput_requests,
                    concurrency=p.throughput_concurrency, jitter=p.throughput_jitter, name=f"{arm.name}-throughput")
        out["throughput"] = analysis.throughput(b, tin, tout, p.throughput_jitter, scale)
        log(f"[perf] {arm.name}: throughput {out['throughput']['output_tok_s']} tok/s "
            f"({time.monotonic() - t0:.1f} s)")
    else:
        out["throughput"] = None
    return out


def client_overhead(m: Measurer, p, tokenizer: str | None, log: Callable[[str], None]) -> dict[str, Any] | None:
    """The client's own share of what it measures: against a fake server on loopback whose ITL is exactly
    PROBE_ITL_MS and TTFT exactly PROBE_TTFT_MS, measured minus true (ms; worst of two lengths)."""
    law = LatencyLaw(itl_a_ms=PROBE_ITL_MS, ttft_a_ms=PROBE_TTFT_MS)
    with fake_server_process(law, model="overhead-probe", max_model_len=1 << 20) as url:
        lengths = sorted({p.min_input, max(p.min_input, 8192)})
        pts = []
        for n in lengths:
            b = m.batch(url, "overhead-probe", tokenizer, input_len=n,
                        output_len=p.sweep_output_tokens, n=max(2, p.sweep_requests), concurrency=1,
                        name=f"overhead-{n}")
            pts.append(analysis.point(b))
    ok = [x for x in pts if x["itl_ms"] is not None]
    if not ok:
        return None
    res = {"itl_ms": round(max(x["itl_ms"] for x in ok) - PROBE_ITL_MS, 6),
           "ttft_ms": round(max(x["ttft_ms"] for x in ok) - PROBE_TTFT_MS, 6), "points": pts,
           "method": f"same client against a loopback fake server with ITL {PROBE_ITL_MS} ms and TTFT "
                     f"{PROBE_TTFT_MS} ms exactly: measured minus true, worst of the lengths"}
    log(f"[perf] client overhead: ITL {res['itl_ms']:.4f} ms, TTFT {res['ttft_ms']:.3f} ms")
    return res


def run(cfg, run_dir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure every arm, write perf.json (+ plots) into run_dir and return it."""
    from fp8eval.validate import validate_config

    validate_config(cfg)  # before any engine or server starts
    p = cfg.perf
    acfg = perf_cfg(cfg, p.dummy_weights)
    # The one door: arms composed like the runner's (a BF16 control arm included); perf.arms lists them.
    arms = resolve_arms(acfg, list(p.arms)) if p.arms else resolve_arms(acfg)
    names = [a.name for a in arms]
    kvs = {a.name: a for a in arms}
    with open_engines(acfg, kind="server") as door:  # one server per arm, closed on the way out
        return _run(cfg, p, names, kvs, door, run_dir, log)


def _run(cfg, p, names: list[str], kvs: dict, door: ArmEngines, run_dir: Path, log: Callable[[str], None]):
    client = pick_client(p.client)
    if client == "vllm_bench" and p.dummy_weights:
        # vllm bench's random dataset draws its prompts through a tokenizer; dummy models have none.
        log("[perf] perf.dummy_weights=true: the model has no tokenizer, so `vllm bench serve` (its random "
            "dataset needs one) cannot drive it; using the built-in token-id client")
        client = "builtin"
    bench_dir = run_dir / "bench"
    result: dict[str, Any] = {"schema": PERF_SCHEMA, "model": cfg.model.name, "dummy_weights": bool(p.dummy_weights),
                              "client": client, "baseline": names[0],
                              "variant": next((n for n, a in kvs.items() if a.role == "variant"), cfg.kv.name), "arms": {},
                              "settings": _settings(p), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if p.measure_client_overhead and client == "builtin":
        # First, so a run stopped by a time limit still has it (it needs no server of the arm's).
        result["client_overhead"] = _overhead_or_error(client, bench_dir, cfg.seed, p, None, log)
    tokenizer = None
    opened, pool = _open_all(door, names, kvs, log) if p.parallel_start else ({}, None)
    try:
        for name in names:
            t0 = time.monotonic()
            arm = None
            try:
                arm = opened.pop(name) if p.parallel_start else _open_one(door, kvs[name], log)
                if isinstance(arm, BaseException):
                    raise arm
                m = Measurer(client, bench_dir, cfg.seed, model_vocab(arm.engine.args.get("model"), p.vocab_size),
                             p.request_timeout_s)
                tokenizer = tokenizer or arm.tokenizer
                result["arms"][name] = measure_arm(arm, m, p, log)
            except Exception as exc:  # noqa: BLE001 - an arm that cannot run is recorded; the others go on
                log(f"[perf] {name}: FAILED: {redact(exc)}")
                result["arms"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            finally:
                if isinstance(arm, Arm):
                    arm.close()
            result["arms"][name]["wall_s"] = round(time.monotonic() - t0, 1)
            _write(result, run_dir)  # after every arm: a run stopped by a time limit keeps what it measured
    finally:
        for left in opened.values():  # servers started but never measured (an earlier error)
            if isinstance(left, Arm):
                left.close()
        if pool is not None:
            pool.shutdown(wait=True)
    if p.measure_client_overhead and client != "builtin":
        # vllm bench draws prompts through the model's tokenizer, known once an arm has started.
        result["client_overhead"] = _overhead_or_error(client, bench_dir, cfg.seed, p, tokenizer, log)
    if p.plots:
        from fp8eval.perf.plots import write_plots

        _derive(result)
        result["plots"] = write_plots(result, run_dir)
    _write(result, run_dir)
    return result


def _overhead_or_error(client, bench_dir, seed, p, tokenizer, log) -> dict[str, Any] | None:
    try:
        return client_overhead(Measurer(client, bench_dir, seed, 32000, p.request_timeout_s), p, tokenizer, log)
    except (LoadError, OSError) as exc:
        return {"error": str(exc)}


def _write(result: dict[str, Any], run_dir: Path) -> None:
    _derive(result)
    tmp = run_dir / "perf.json.tmp"
    tmp.write_text(json.dumps(redact_obj(result), indent=2) + "\n", encoding="utf-8")
    tmp.replace(run_dir / "perf.json")


def _open_one(door: ArmEngines, kv, log: Callable[[str], None]) -> Arm:
    t0 = time.monotonic()
    arm = open_arm(door, kv)
    log(f"[perf] {kv.name}: server ready at {redact(arm.url)} ({time.monotonic() - t0:.0f} s), "
        f"KV capacity {arm.capacity.get('tokens')} tokens")
    return arm


def _open_all(door: ArmEngines, names: list[str], kvs: dict, log: Callable[[str], None]):
    """Start every arm's server at once (their start-ups overlap; the measurements stay one at a time).
    Each server must then be given its share of the accelerator (gpu_memory_utilization /
    kv_cache_memory_bytes), which the caller sets. Returns ({name: Arm or the exception}, pool): the
    pool's threads must outlive the servers, because a server dies with the THREAD that started it
    (PR_SET_PDEATHSIG in fp8eval.engines.vllm.child); shut the pool down after closing them."""
    from concurrent.futures import ThreadPoolExecutor

    from fp8eval.engines.vllm import child as vchild

    # Signal handlers that stop the servers can only be installed from the main thread.
    vchild._install_handlers()
    pool = ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="perf-start")
    futures = {n: pool.submit(_open_one, door, kvs[n], log) for n in names}
    out: dict[str, Arm | BaseException] = {}
    for n, f in futures.items():
        exc = f.exception()
        out[n] = exc if exc is not None else f.result()
    return out, pool


def _settings(p) -> dict[str, Any]:
    from dataclasses import asdict, is_dataclass

    return asdict(p) if is_dataclass(p) else dict(p)


def _derive(result: dict[str, Any]) -> None:
    """break_even_tokens and capacity_gain of each non-baseline arm; the variant's at the top level."""
    arms, base = result["arms"], result["baseline"]
    ok = {n: a for n, a in arms.items() if "error" not in a}
    evens = analysis.break_evens(ok, base) if base in ok else {}
    base_cap = (arms.get(base) or {}).get("kv_capacity_tokens")
    for name, arm in arms.items():
        if name == base or "error" in arm:
            continue
        arm["break_even_tokens"] = evens.get(name)
        cap = arm.get("kv_capacity_tokens")
        arm["capacity_gain"] = round(cap / base_cap, 4) if cap and base_cap else None
    variant = arms.get(result["variant"]) or {}
    result["break_even_tokens"] = variant.get("break_even_tokens")
    result["capacity_gain"] = variant.get("capacity_gain")
