"""Prompt operations of the vLLM worker (run in the vLLM Python): a request's prompt token ids (one, or the
counts of many tokenized in one batch), top-k prompt log-probs of several prompts in one batch
(`python -m fp8eval.divergence`), and teacher forcing of a continuation (the anatomy of a flip: the
log-probability and rank of each forced token under this arm)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fp8eval.engines.prompting import check_template_kwargs, plain_prompt_text


def prompt_text(worker, req: dict) -> tuple[str, bool]:
    """The text the worker tokenizes for `req` and whether the tokenizer adds its special tokens."""
    tok = worker.tokenizer
    if req.get("prompt_text") is not None:
        return req["prompt_text"], True
    # Render the template to text, then tokenize without adding special tokens again: what vLLM's
    # own chat entry points do, so a BOS in the template is not doubled.
    kwargs = req.get("chat_template_kwargs") or {}
    worker.checked = getattr(worker, "checked", set())
    key = json.dumps(kwargs, sort_keys=True)
    if kwargs and key not in worker.checked and not worker.dummy:  # a dummy run's stand-in tokenizer: not the model's
        check_template_kwargs(tok, kwargs, render=lambda kw: tok.apply_chat_template(
            [{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True, **kw))
        worker.checked.add(key)
    try:
        return tok.apply_chat_template(req["messages"], tokenize=False, add_generation_prompt=True, **kwargs), False
    except ValueError as e:
        if "chat_template" not in str(e) and "chat template" not in str(e):
            raise
        # A tokenizer without a template (the model config claims one): plain text, as every engine
        # sends it (engines/prompting.py).
        return plain_prompt_text(req["messages"]), True


def load_tokenizer(engine_args: dict[str, Any]):
    """The tokenizer vLLM would load for `engine_args` (its `tokenizer`, else `model`)."""
    name = engine_args.get("tokenizer") or engine_args["model"]
    kwargs = {"trust_remote_code": bool(engine_args.get("trust_remote_code", False)),
              "revision": engine_args.get("tokenizer_revision") or engine_args.get("revision")}
    get_tokenizer = None
    for module in ("vllm.tokenizers", "vllm.transformers_utils.tokenizer"):
        try:
            get_tokenizer = getattr(__import__(module, fromlist=["get_tokenizer"]), "get_tokenizer")
            break
        except (ImportError, AttributeError):
            continue
    if get_tokenizer is not None:
        return get_tokenizer(name, tokenizer_mode=engine_args.get("tokenizer_mode", "auto"), **kwargs)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name, **kwargs)


def tokenizer_fingerprint(tok) -> str | None:
    """A hash of everything a prompt's token count depends on, or None when it cannot be known (a tokenizer
    without a Rust backend): the transformers class, the backend's JSON, the chat template, the special tokens."""
    if tok is None:
        return None
    backend = getattr(tok, "backend_tokenizer", None) or getattr(tok, "_tokenizer", None)
    to_str = getattr(backend, "to_str", None)
    if not callable(to_str):
        return None
    cls = next((c for c in type(tok).__mro__ if c.__module__.split(".")[0] == "transformers"), type(tok))
    material = {"class": f"{cls.__module__}.{cls.__qualname__}", "backend": hashlib.sha256(
        to_str().encode("utf-8")).hexdigest(), "chat_template": getattr(tok, "chat_template", None),
        "special": getattr(tok, "special_tokens_map", None), "is_fast": getattr(tok, "is_fast", None)}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def _encode(tok, text: str, special: bool) -> list[int]:
    return list(tok.encode(text) if special else tok.encode(text, add_special_tokens=False))


def prompt_ids(worker, req: dict) -> list[int]:
    """The prompt token ids of `req` under the worker's tokenizer (chat template applied)."""
    return _encode(worker.tokenizer, *prompt_text(worker, req))


def count_many(worker, reqs: list[dict]) -> list[int]:
    """len(prompt_ids(r)) for each request. A fast (Rust) tokenizer encodes each group of texts in one batch
    call, which runs on every core; the batch's shortest text is also encoded alone and must agree, else
    (and for any other tokenizer) each text is encoded alone as prompt_ids does."""
    tok = worker.tokenizer
    texts = [prompt_text(worker, r) for r in reqs]
    out: list[int | None] = [None] * len(texts)
    if getattr(tok, "is_fast", False) is True and getattr(worker, "batch_counts_ok", True):
        for special in (True, False):
            idx = [i for i, (_, s) in enumerate(texts) if s == special]
            if not idx:
                continue
            ids = tok([texts[i][0] for i in idx], add_special_tokens=special)["input_ids"]
            check = min(range(len(idx)), key=lambda j: len(texts[idx[j]][0]))
            if list(ids[check]) != _encode(tok, *texts[idx[check]]):
                worker.batch_counts_ok = False  # this tokenizer's batch call differs: one by one from now on
                break
            for i, row in zip(idx, ids):
                out[i] = len(row)
    return [n if n is not None else len(_encode(tok, text, special)) for n, (text, special) in zip(out, texts)]


def prompt_logprobs(llm, batch: list[list[int]], k: int) -> list[tuple[list, list, list]]:
    """For each prompt of `batch` (sent to vLLM together, so they may share batches): the top-k (token id,
    log-prob) after each of positions 0..len-2, two [len-1, k] lists, and the log-prob of the prompt's own next token
    there (prefill path; fp8eval.engines.vllm.forced gives the same from decode steps)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k)
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids in batch], params, use_tqdm=False)
    result = []
    for ids, out in zip(batch, outs):
        rows_ids, rows_lp, own = [], [], []
        for t, entry in zip(ids[1:], list(out.prompt_logprobs)[1:]):
            # Each entry holds the top-k plus the prompt's own token (which may rank below k): keep the k best.
            best = sorted(entry.items(), key=lambda item: -float(item[1].logprob))[:k]
            rows_ids.append([int(t) for t, _ in best])
            rows_lp.append([float(lp.logprob) for _, lp in best])
            own.append(float(entry[int(t)].logprob) if int(t) in entry else float("nan"))
        result.append((rows_ids, rows_lp, own))
    return result


REPLAY_LOGPROBS = 20  # vLLM's default max_logprobs: a baseline token ranked below it has no decode-path log-prob


def _replayed_row(worker, req: dict, prompt: list[int], ids: list[int], p: int) -> tuple[dict | None, str]:
    """The decode path at the parting position `p` (issue 35): this arm's own generation replayed with the request's
    sampling (greedy, or its seed) and log-probs, so step p is a decode step after the tokens the arm generated itself.
    (row, "") when the replay re-generates ids[:p], else (None, why). The row's log-prob and rank (Logprob.rank) are the
    baseline token's when it is among the REPLAY_LOGPROBS returned, else None."""
    from vllm.inputs import TokensPrompt

    params = worker.sampling_params(req, len(prompt))
    params.max_tokens, params.logprobs = p + 1, REPLAY_LOGPROBS
    got = worker.llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0].outputs[0]
    if list(got.token_ids[:p]) != list(ids[:p]) or len(got.logprobs or []) <= p:
        return None, "the replay of this arm's generation did not re-generate the shared tokens"
    entry = got.logprobs[p]
    top = min(entry.items(), key=lambda item: (getattr(item[1], "rank", None) or 1 << 30, -float(item[1].logprob)))
    lp = entry.get(int(ids[p]))
    return {"logprob": float(lp.logprob) if lp else None, "rank": getattr(lp, "rank", None) if lp else None,
            "top1": int(top[0])}, ""


def teacher_force(worker, req: dict, forced_text: str, other_text: str) -> dict:
    """The anatomy of one flip (fp8eval.engines.forcing): the prompt and the baseline's completion up to the
    parting token prefilled once with prompt_logprobs=1, which gives the forced token's log-probability, its
    rank (vLLM's Logprob.rank; 1 = this arm's greedy choice) and this arm's most likely token there: the prefill view.
    After the first token, the decode view where the arm produced its answer (`_replayed_row`) is the row's, with the
    prefill view beside it; `path` says which one the row holds."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from fp8eval.engines import forcing

    tok = worker.tokenizer
    prompt = worker.prompt_ids(req)
    forced = list(tok.encode(forced_text, add_special_tokens=False))
    other = list(tok.encode(other_text, add_special_tokens=False))
    ids, p = forcing.forced_ids(forced, other, tok.eos_token_id)
    row = None
    if p < len(ids):
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)
        out = worker.llm.generate([TokensPrompt(prompt_token_ids=prompt + ids[:p + 1])], params, use_tqdm=False)[0]
        entry = list(out.prompt_logprobs)[len(prompt) + p]
        lp = entry[int(ids[p])]
        top = min(entry.items(), key=lambda item: (getattr(item[1], "rank", None) or 1 << 30, -float(item[1].logprob)))
        row = {"logprob": float(lp.logprob), "rank": getattr(lp, "rank", None), "top1": int(top[0])}
    decoded, why = _replayed_row(worker, req, prompt, ids, p) if row is not None and p > 0 else (None, "")
    out = forcing.answer(p, forced, other, decoded or row, lambda t: tok.decode([t]), path="decode" if decoded else
                         "prefill", prefill=row if decoded else None)
    return {**out, **({"decode_view": why} if why else {})}
