"""Decode-path log-probs on vLLM (issue 35; runs in the vLLM Python): a passage's tokens forced one decode step at a
time, each step's top-k log-probs as the decode kernel computed them.

How: the request's prompt is the passage's first token; a logits processor (`ForcedTokens`, registered at engine
start with `logits_processors=[FQCN]`) then makes the k-th generated token the passage's (k+1)-th by setting every
other logit of that request's row to -inf. vLLM's sampler takes the returned log-probs *before* any logits processor
runs when `logprobs_mode` is `raw_logprobs` (its default: vllm/v1/sample/sampler.py computes `raw_logprobs` from the
model's logits first, then applies the processors and samples), so each step's log-probs are the model's own
distribution after the forced prefix, computed by a decode step: one query token against the paged KV cache, the
kernel path every generated answer takes (FA3's decode tiles and split-KV on Hopper, docs/kv-formats.md). Requests
without the extra argument are left alone, so the processor changes nothing else.

This module imports no vLLM at import time: `ForcedTokens` is built on first access (vLLM loads it by name).
"""

from __future__ import annotations

KEY = "fp8eval_forced"  # SamplingParams.extra_args key: the token ids to emit, in order
FQCN = "fp8eval.engines.vllm.forced:ForcedTokens"  # what `logits_processors` names (capabilities' decode_logits_processor)


def __getattr__(name: str):
    if name == "ForcedTokens":
        cls = _build()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def _build():
    from vllm.v1.sample.logits_processor import LogitsProcessor, MoveDirectionality

    class ForcedTokens(LogitsProcessor):
        """Emits, for each request carrying `extra_args[KEY]`, those tokens in order (every other logit -inf)."""

        def __init__(self, vllm_config, device, is_pin_memory):  # noqa: ARG002 - vLLM's constructor signature
            self.rows: dict[int, tuple[list[int], list[int]]] = {}  # batch row -> (forced ids, its output ids)

        @classmethod
        def validate_params(cls, params):
            forced = (getattr(params, "extra_args", None) or {}).get(KEY)
            if forced is not None and not (isinstance(forced, list) and all(isinstance(t, int) for t in forced)):
                raise ValueError(f"extra_args[{KEY!r}] must be a list of token ids")

        def is_argmax_invariant(self) -> bool:
            return False  # it decides the token, also under greedy sampling

        def update_state(self, batch_update) -> None:
            if batch_update is None:
                return
            for i in batch_update.removed:
                self.rows.pop(i, None)
            for added in batch_update.added:  # (index, params, [prompt ids,] output ids: the live list)
                i, params, out = added[0], added[1], added[-1]
                forced = (getattr(params, "extra_args", None) or {}).get(KEY)
                if forced:
                    self.rows[i] = (forced, out)
                else:
                    self.rows.pop(i, None)
            for a, b, how in batch_update.moved:
                ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
                if ra is not None:
                    self.rows[b] = ra
                if rb is not None and how == MoveDirectionality.SWAP:
                    self.rows[a] = rb

        def apply(self, logits):
            for i, (forced, out) in self.rows.items():
                n = len(out)
                if n < len(forced):
                    t = int(forced[n])
                    logits[i].fill_(float("-inf"))
                    logits[i, t] = 0.0
            return logits

    return ForcedTokens


def decode_logprobs(llm, batch: list[list[int]], k: int) -> list[tuple[list, list, list]]:
    """For each passage of `batch` (decoded together, as a batch of requests): the top-k (token id, log-prob) of the
    decode step after each of positions 0..len-2 and the log-prob of the passage's own next token there: three lists.
    RuntimeError when the engine was not started with the processor or returns processed log-probs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    mode = str(getattr(llm.llm_engine.model_config, "logprobs_mode", "raw_logprobs"))
    if "raw_logprobs" not in mode:
        raise RuntimeError(f"decode-path log-probs need logprobs_mode=raw_logprobs (the engine runs {mode})")
    params = [SamplingParams(max_tokens=len(ids) - 1, temperature=0.0, logprobs=k, ignore_eos=True, detokenize=False,
                             extra_args={KEY: [int(t) for t in ids[1:]]}) for ids in batch]
    outs = llm.generate([TokensPrompt(prompt_token_ids=[int(ids[0])]) for ids in batch], params, use_tqdm=False)
    result = []
    for ids, out in zip(batch, outs):
        got = out.outputs[0]
        want = [int(t) for t in ids[1:]]
        if list(got.token_ids) != want:
            same = next((i for i, (a, b) in enumerate(zip(got.token_ids, want)) if a != b), min(len(got.token_ids), len(want)))
            raise RuntimeError(f"forced decoding followed the passage for {same} of {len(want)} tokens: start vLLM "
                               f"with logits_processors=['{FQCN}'] (python -m fp8eval.divergence does); if it was, "
                               f"the processor read the step from the length of the request's output ids, which this "
                               f"vLLM keeps otherwise (try ++engine.engine_args.async_scheduling=false)")
        rows_ids, rows_lp, own = [], [], []
        for t, entry in zip(want, got.logprobs):
            best = sorted(entry.items(), key=lambda item: -float(item[1].logprob))[:k]
            rows_ids.append([int(i) for i, _ in best])
            rows_lp.append([float(lp.logprob) for _, lp in best])
            own.append(float(entry[t].logprob))
        result.append((rows_ids, rows_lp, own))
    return result


def greedy_ids(llm, batch: list[list[int]], n: int) -> list[list[int]]:
    """The greedy continuation of `n` tokens after each sequence of `batch` (generated together, EOS ignored): what
    `divergence.continuation=greedy` forces instead of the passage's own text."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=int(n), temperature=0.0, ignore_eos=True, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=[int(t) for t in ids]) for ids in batch], params, use_tqdm=False)
    return [[int(t) for t in out.outputs[0].token_ids] for out in outs]
