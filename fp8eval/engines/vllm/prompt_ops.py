"""Prefill-only operations of the vLLM worker (run in the vLLM Python): top-k prompt log-probs of several
prompts in one batch (`python -m fp8eval.divergence`), and teacher forcing of a continuation (the anatomy of
a flip: the log-probability and rank of each forced token under this arm)."""

from __future__ import annotations


def prompt_logprobs(llm, batch: list[list[int]], k: int) -> list[tuple[list[list[int]], list[list[float]]]]:
    """For each prompt of `batch` (sent to vLLM together, so they may share batches): the top-k (token id,
    log-prob) after each of positions 0..len-2, two [len-1, k] lists."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k)
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids in batch], params, use_tqdm=False)
    result = []
    for out in outs:
        rows_ids, rows_lp = [], []
        for entry in list(out.prompt_logprobs)[1:]:
            # Each entry holds the top-k plus the prompt's own token (which may rank below k): keep the k best.
            best = sorted(entry.items(), key=lambda item: -float(item[1].logprob))[:k]
            rows_ids.append([int(t) for t, _ in best])
            rows_lp.append([float(lp.logprob) for _, lp in best])
        result.append((rows_ids, rows_lp))
    return result


def teacher_force(worker, req: dict, forced_text: str, other_text: str) -> dict:
    """The anatomy of one flip (fp8eval.engines.forcing): the prompt and the baseline's completion up to the
    parting token prefilled once with prompt_logprobs=1, which gives the forced token's log-probability, its
    rank (vLLM's Logprob.rank; 1 = this arm's greedy choice) and this arm's most likely token there."""
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
    return forcing.answer(p, forced, other, row, lambda t: tok.decode([t]))
