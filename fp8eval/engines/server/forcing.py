"""Teacher forcing on an OpenAI-compatible vLLM server (the anatomy of a flip, fp8eval.engines.forcing).

The prompt's token ids from `/tokenize` (the chat template applied, as generation sees it), both completions'
ids from `/tokenize` without special tokens, then one `/v1/completions` with the prompt ids and the baseline's
completion up to the parting token, `echo` and `logprobs=K`: the echoed logprob of the forced token, its rank
among the top K (None when it ranks below K: the rank is then only known to be > K), and the top-1 token.
Token text comes from `/detokenize` where the server has it, else from the echoed token strings.
"""

from __future__ import annotations

from typing import Any

from fp8eval.engines import forcing
from fp8eval.engines.base import Request

TOP_K = 20  # vLLM's default max_logprobs: the largest K every server accepts


def _refused(status: int, text: str) -> str:
    return (f"the server refused a teacher-forcing request: HTTP {status} {text}. The anatomy of a flip needs a "
            "vLLM server (/tokenize, echo with logprobs).")


def teacher_force(engine, req: Request, forced_text: str, other_text: str) -> dict:
    """The anatomy of one flip through a server arm (see the module docstring)."""
    model = engine.model_id
    if req.prompt_text is not None:
        body: dict[str, Any] = {"model": model, "prompt": req.prompt_text}
    else:
        body = {"model": model, "messages": list(req.messages), "add_generation_prompt": True}
        if req.chat_template_kwargs:
            body["chat_template_kwargs"] = dict(req.chat_template_kwargs)
    prompt = [int(t) for t in engine.post_json("/tokenize", body, _refused)["tokens"]]

    def ids(text: str) -> list[int]:
        r = engine.post_json("/tokenize", {"model": model, "prompt": text, "add_special_tokens": False}, _refused)
        return [int(t) for t in r["tokens"]]

    forced, other = ids(forced_text), ids(other_text)
    todo, p = forcing.forced_ids(forced, other, None)
    names: dict[int, str] = {}
    row = None
    if p < len(todo):
        body = {"model": model, "prompt": prompt + todo[:p + 1], "max_tokens": 1, "temperature": 0,
                "logprobs": TOP_K, "echo": True}
        lp = engine.post_json("/v1/completions", body, _refused)["choices"][0]["logprobs"]
        pos = len(prompt) + p
        token_lp = float(lp["token_logprobs"][pos])
        top = {str(k): float(v) for k, v in (lp["top_logprobs"][pos] or {}).items()}
        higher = sum(1 for v in top.values() if v > token_lp)
        names[todo[p]] = str(lp["tokens"][pos])
        row = {"logprob": token_lp, "rank": higher + 1 if higher < TOP_K else None,
               "top1_text": max(top, key=top.get) if top else None}

    def decode(t: int) -> str:
        if t not in names:
            try:
                names[t] = str(engine.post_json("/detokenize", {"model": model, "tokens": [t]}, _refused)["prompt"])
            except Exception:  # noqa: BLE001 - an older server without /detokenize: the id then
                names[t] = f"<id {t}>"
        return names[t]

    return forcing.answer(p, forced, other, row, decode, path="prefill")  # echo: one forward of prompt + tokens
