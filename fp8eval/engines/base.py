"""The engine protocol shared by every backend (fake, reference, vllm, server).

An engine receives `Request`s (one prompt, `n` samples, one seed per sample) and yields one
`Completion` per request as soon as it is done, in any order, so the runner can append records as
they arrive and a crash loses only the requests in flight. What an engine can do beyond that is said by its
class's `capabilities` (a `Capabilities`), and the optional methods are declared once in `EngineBase`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, ContextManager, Iterable, Iterator, Protocol, runtime_checkable

from fp8eval.core.errors import Fp8evalError
from fp8eval.core.types import (  # noqa: F401 - the engine API's types
    Choice,
    Completion,
    Request,
    decode_loglikelihoods,
    encode_loglikelihoods,
)


class EngineError(Fp8evalError):
    """An engine could not be started or cannot serve the requested configuration.

    The message is shown to the user as is: one paragraph saying what, why, and what to do instead.
    """


@dataclass(frozen=True)
class Capabilities:
    """What an engine kind can do, as facts readable before it starts (the class attribute `capabilities` of every
    engine; `fp8eval.engines.capabilities(cfg)` resolves `engine=auto` first). Wings ask these, never the kind's
    name: a new engine declares its own and no file outside fp8eval/engines/ changes. Defaults: an engine that
    generates and nothing more. `tests/test_engine_capabilities.py` checks each engine class against its table."""

    # Per-position next-token distributions of a token sequence: "hidden" (final hidden states and logits of the
    # full vocabulary, through `probe()`), "topk" (the top-k log-probs of every position, `prompt_logprobs`) or
    # "none" (the divergence probe refuses it).
    distributions: str = "none"
    # The largest top-k a position gives unless an engine arg raises it: (arg, default limit), or None (no limit).
    topk_limit: tuple[str, int] | None = None
    # `probe(policy)` runs a prefill under any KV policy (per-layer formats): what sensitivity ranks layers with.
    switches_kv_policy: bool = False
    loglikelihood: bool = False  # scoring requests (lm-eval's loglikelihood / multiple choice)
    teacher_force: bool = False  # the anatomy of a flip (fp8eval.engines.forcing)
    follows_sampling: bool = True  # False: answers are scripted, sampling settings (temperature, seeds) ignored
    # "module:Class" of a tokenizer-only worker that counts prompt tokens while the engine starts, so planning
    # overlaps the start ("": planning waits for the engine); the class has `prepare(cfg, arm)`.
    early_counter: str = ""
    # How it chunks a prefill: "engine" (the engine group's `prefill_chunk`), "scheduler" (vLLM's batched-token
    # budget, engine args) or "none".
    prefill_chunking: str = "none"
    # Which of a control arm's knobs it honours (fp8eval.control): every vLLM engine arg (`all_engine_args`, why),
    # else only these args, each with its rule ("batch_cap": effective when a request's repeats exceed it,
    # "positive": effective when > 0); the engine-group fields it reads per arm; whether the arm's `env` reaches
    # a process of its own; whether it may attach to a server it did not start (then only that server's own
    # flags count); the engine args under which seeds matter even when it ignores sampling.
    all_engine_args: bool = False
    engine_args_why: str = ""
    honoured_args: tuple[tuple[str, str], ...] = ()
    engine_fields: tuple[str, ...] = ()
    process_env: bool = False
    attaches: bool = False
    seed_args: tuple[str, ...] = ()
    control_hint: str = ""  # which control=... options take effect on it, in words (the inert control's refusal)
    # The decode path of its distributions (issue 35, fp8eval.divergence.paths): "probe" (`probe().decode_hidden`: one
    # decode step per token, computed in one pass), "forced" (`decode_logprobs_many`: generation forced to the passage by the logits processor
    # `decode_logits_processor`, which the engine needs among its `logits_processors` engine arg at start) or "none".
    decode_path: str = "none"
    decode_logits_processor: str = ""


def _cannot(engine, what: str, flag: str) -> NotImplementedError:
    kind = getattr(engine, "kind", None) or type(engine).__name__
    return NotImplementedError(f"the {kind} engine cannot {what} (its capabilities.{flag} is not set); "
                               f"ask `capabilities` before calling it")


class EngineBase:
    """The protocol's optional half, declared once with its defaults: engines inherit from it and override what
    their `capabilities` say they can do. A method an engine cannot serve raises NotImplementedError with a clear
    message; the informational ones answer "nothing" (None or {})."""

    kind: str = ""
    capabilities: ClassVar[Capabilities] = Capabilities()
    preflight: dict | None = None  # what the engine read back at start (vLLM engines)
    knob_audit: dict | None = None  # fp8eval.engines.audit: what the engine really runs (set at start or load)
    startup_log: str = ""  # what the engine's process logged while it started (vLLM: its KV cache size line)

    @classmethod
    def prestart(cls, arm_cfgs: list, shared: dict) -> dict | None:
        """Start every arm's engine at once ([(arm config, ArmSpec)], before any is built: the engines built later
        adopt what was started, from `shared`); what was started, or None (the default: nothing, the arms start one
        after the other). vLLM on one GPU: fp8eval.engines.vllm.startup."""
        return None

    @classmethod
    def effective_engine_args(cls, cfg: Any, arm: Any) -> dict:
        """The engine args this kind runs the arm with, defaults it adds included (vLLM: `enforce_eager` from
        engine.cuda_graphs), before it starts: what a control arm's knobs are compared with."""
        return dict(arm.engine_args)

    def token_count_key(self) -> dict | None:
        """The tokenizer's identity (token counts are then cached on disk); None: counts are not kept."""
        return None

    def count_prompt_tokens_many(self, requests: list[Request]) -> list[int]:
        """Token counts of many requests (engines with a batched tokenizer call override it)."""
        return [self.count_prompt_tokens(r) for r in requests]  # type: ignore[attr-defined]

    def prefill_stats(self) -> dict | None:
        """The engine's own prefill counters since it started (the arm summary's `engine_prefill`), or None."""
        return None

    def startup_warnings(self) -> dict[str, list[str]] | None:
        """What the engine warned about at start (uncalibrated scales, fallbacks), by kind of warning; None: an
        engine that does not report start-up warnings."""
        return None

    def pool_stats(self) -> dict | None:
        """A replica pool's replicas dropped or ejected and failures per replica; None for one engine."""
        return None

    def audit_now(self) -> dict | None:
        """The knob audit of this arm, the engine loaded first where it loads lazily."""
        return self.knob_audit

    def loglikelihood(self, requests: Iterable[Request]) -> Iterator[Completion]:
        """For requests with logprob_pairs: one Completion per request, n identical Choices whose text is
        encode_loglikelihoods([(logprob, is_greedy) per pair]), finish_reason "stop", output_tokens 0."""
        raise _cannot(self, "score loglikelihood requests", "loglikelihood")

    def teacher_force(self, request: Request, forced_text: str, other_text: str) -> dict:
        """Where two completions part, the arm's log-prob and rank of the forced token (fp8eval.engines.forcing)."""
        raise _cannot(self, "teacher-force a completion", "teacher_force")

    def prompt_logprobs(self, ids: list[int], k: int) -> tuple[list[list[int]], list[list[float]]]:
        """The top-k (token ids, log-probs) after every position of `ids` but the last (distributions "topk")."""
        raise _cannot(self, "give per-position top-k log-probs", "distributions")

    def prompt_logprobs_many(self, batch: list[list[int]], k: int) -> list[tuple[list, list]]:
        """`prompt_logprobs` of several sequences (engines that batch them override it)."""
        return [self.prompt_logprobs(ids, k) for ids in batch]

    def decode_logprobs_many(self, batch: list[list[int]], k: int) -> list[tuple[list, list, list]]:
        """`prompt_logprobs_many` from decode steps, the sequence forced (decode_path "forced"): top-k ids, top-k
        log-probs and each next token's own log-prob, per sequence."""
        raise _cannot(self, "give decode-path log-probs", "decode_path")

    def greedy_ids_many(self, batch: list[list[int]], n: int) -> list[list[int]]:
        """The greedy continuation of `n` tokens after each sequence (EOS ignored): the forced text of
        `divergence.continuation=greedy` (decode_path "forced"; the reference engine's probe has `greedy_ids`)."""
        raise _cannot(self, "continue token ids greedily", "decode_path")

    def probe(self, policy: Any = None) -> ContextManager[Any]:
        """A context manager giving a probe of the loaded model under `policy` (None: the arm's own KV policy):
        per-position hidden states and logits of a token sequence (distributions "hidden"; the reference engine's
        `fp8eval.engines.reference_probe.Probe`)."""
        raise _cannot(self, "probe hidden states under a KV policy", "distributions")


@runtime_checkable
class Engine(Protocol):
    kind: str

    def describe(self) -> dict[str, Any]:
        """Everything about this engine that can change a number (goes into the arm fingerprint):
        engine kind and version, model id and revision, every engine arg, what preflight read back."""

    def max_model_len(self) -> int:
        """Largest prompt + output length in tokens this engine accepts."""

    def count_prompt_tokens(self, request: Request) -> int:
        """Tokens of the request's prompt exactly as the engine will see it (chat template applied)."""

    def generate(self, requests: Iterable[Request]) -> Iterator[Completion]:
        """Yield one Completion per request, as each finishes."""

    def close(self) -> None:
        """Release everything (processes, GPU memory). Safe to call twice."""
