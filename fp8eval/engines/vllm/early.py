"""Prompt token counting while vLLM starts (issue 26: the harness's share of a GPU run).

A vLLM start takes a minute on a GPU; planning a run (building every prompt, counting its tokens under the
model's chat template) needs only the tokenizer and max_model_len. `TokenizerWorker` is a second worker in
the vLLM Python that loads the tokenizer alone, the way vLLM does (`prompt_ops.load_tokenizer`: vLLM's own
`get_tokenizer` where importable, else transformers' AutoTokenizer), and answers the same `count` /
`count_many` requests as the engine's worker; the runner plans through it in a thread while the engine
starts (fp8eval.token_counts.EarlyPlan).

Nothing planned this way is used unless the started engine proves it would have counted the same: its
max_model_len equals the one planned with (the arm's `max_model_len` engine arg) and its tokenizer has the
same fingerprint (`prompt_ops.tokenizer_fingerprint`: the tokenizer class, the Rust tokenizer's whole JSON,
the chat template and the special tokens). Otherwise the runner plans again with the engine, as it always did.
"""

from __future__ import annotations

import os
import subprocess
import time

from fp8eval.engines.base import EngineError
from fp8eval.engines.vllm import child as vchild
from fp8eval.engines.vllm_offline import WORKER_MODULE, VLLMOfflineEngine


class TokenizerWorker(VLLMOfflineEngine):
    """The tokenizer of an arm's vLLM engine in a worker of its own, without the model. Started at once (the
    process), ready after `wait_ready()`; counts prompt tokens exactly as the engine's worker does."""

    kind = "vllm-tokenizer"

    @staticmethod
    def prepare(cfg, arm) -> None:
        """The arm's model made loadable (an embedded GGUF converted once) before the worker starts."""
        from fp8eval.engines.vllm.args import vllm_engine_args

        vllm_engine_args(cfg, arm)

    def _start(self) -> None:
        if self.args.get("skip_tokenizer_init") or not self.args.get("max_model_len"):
            raise EngineError("no tokenizer or no max_model_len to plan with before vLLM starts")
        self.log_path = self.log_dir / f"vllm-tokenizer-{self.kv.name}-{os.getpid()}-{int(time.time())}.log"
        env = vchild.child_env()
        env.update({str(k): str(v) for k, v in (getattr(self.cfg.model, "env", None) or {}).items()})
        self._child = vchild.ChildProcess([self.python, "-m", WORKER_MODULE, "--worker", "--tokenizer-only"],
                                          self.log_path, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._send({"engine_args": self.args, "env": {}})
        self.fingerprint: str | None = None

    def wait_ready(self, timeout_s: float) -> None:
        """Wait for the tokenizer to load (EngineError if it fails or takes longer than `timeout_s`)."""
        with self._lock:
            reply = self._recv(timeout_s=timeout_s)
        if reply.get("op") != "ready":
            raise EngineError(f"the tokenizer worker failed: {reply.get('type')}: {reply.get('message')}")
        self.fingerprint = reply.get("fingerprint")
        self.preflight = {"max_model_len": int(self.args["max_model_len"])}

    def same_counts_as(self, engine) -> bool:
        """True when `engine` (started) counts prompt tokens as this worker did: the same max_model_len and the
        same tokenizer fingerprint (never when either fingerprint is unknown)."""
        theirs = getattr(engine, "tokenizer_fingerprint", None)
        return (self.fingerprint is not None and callable(theirs)
                and int(engine.max_model_len()) == self.max_model_len() and theirs() == self.fingerprint)
