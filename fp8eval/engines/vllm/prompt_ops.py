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


def teacher_force(llm, prompt_ids: list[int], forced: list[int]) -> list[dict]:
    """`forced` appended to the prompt and prefilled once: for each forced token, its log-probability, its
    rank (1 = the arm's own greedy choice; vLLM's Logprob.rank) and the arm's most likely token there."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)
    out = llm.generate([TokensPrompt(prompt_token_ids=list(prompt_ids) + list(forced))], params, use_tqdm=False)[0]
    entries = list(out.prompt_logprobs)[len(prompt_ids):]
    rows = []
    for tok, entry in zip(forced, entries):
        lp = entry[int(tok)]
        top = min(entry.items(), key=lambda item: (getattr(item[1], "rank", None) or 1 << 30, -float(item[1].logprob)))
        rows.append({"token": int(tok), "logprob": float(lp.logprob), "rank": int(getattr(lp, "rank", 0) or 0) or None,
                     "top1": int(top[0])})
    return rows
