"""The engine protocol shared by every backend (fake, reference, vllm, server).

An engine receives `Request`s (one prompt, `n` samples, one seed per sample) and yields one
`Completion` per request as soon as it is done, in any order, so the runner can append records as
they arrive and a crash loses only the requests in flight.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Protocol, runtime_checkable

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

    # Optional (engines without it refuse scoring requests, see fp8eval.engines.loglikelihood):
    # def loglikelihood(self, requests: Iterable[Request]) -> Iterator[Completion]:
    #     """For requests with logprob_pairs: one Completion per request, n identical Choices whose text is
    #     encode_loglikelihoods([(logprob, is_greedy) per pair]), finish_reason "stop", output_tokens 0."""
