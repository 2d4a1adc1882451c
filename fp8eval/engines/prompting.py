"""How a chat request becomes a prompt for a model without a chat template, the same for every engine.

A base model (gemma3-270m, `model.chat_template: false`) sees its messages' contents as plain text:
joined by blank lines, ending with one, tokenized WITH the tokenizer's special tokens (BOS), as a
completion prompt. The runner turns such requests into `Request.prompt_text` before any engine sees them,
so reference, vllm and server all send the same text; an engine whose tokenizer turns out to lack a
template although the model config says it has one falls back to the same text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def plain_prompt_text(messages: Iterable[Mapping]) -> str:
    """The messages' contents joined by blank lines, ending with a blank line."""
    return "\n\n".join(str(m["content"]) for m in messages) + "\n\n"


def prompt_text_for(messages: Iterable[Mapping], prompt_text: str | None, chat_template: bool) -> str | None:
    """The raw prompt to send: the task's own raw prompt, else plain text when the model has no template,
    else None (the engine applies the chat template)."""
    if prompt_text is not None:
        return prompt_text
    return None if chat_template else plain_prompt_text(messages)


def template_variables(template: str) -> set[str]:
    """The variables a Jinja chat template reads (what vLLM keeps of `chat_template_kwargs`: it drops the rest)."""
    from jinja2 import Environment, meta

    return set(meta.find_undeclared_variables(Environment().parse(template)))


def check_template_kwargs(tokenizer, kwargs: Mapping, render=None) -> dict:
    """Prove every `chat_template_kwargs` switch reaches the rendered prompt: each name must be a variable of the
    tokenizer's chat template (vLLM silently drops kwargs the template does not declare, vLLM #54616 comment; a
    misspelt switch, e.g. `enable_thinking` for Kimi K2.5 whose template reads `thinking`, changes nothing).
    `render(kwargs)` (optional) renders a probe conversation: the report says whether the switch changed the prompt
    (False: the value equals the template's default). ValueError names the switches that do not reach it."""
    if not kwargs:
        return {}
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one renders chats
        template = template.get("default") or next(iter(template.values()), None)
    if not template:
        raise ValueError(f"chat_template_kwargs {sorted(kwargs)} are set but the tokenizer has no chat template")
    names = template_variables(template)
    missing = sorted(k for k in kwargs if k not in names)
    if missing:
        used = sorted(n for n in names if n not in ("messages", "add_generation_prompt", "tools", "bos_token",
                                                     "eos_token", "raise_exception"))
        raise ValueError(f"chat_template_kwargs {missing} are not read by the model's chat template (it reads "
                         f"{used}); vLLM drops them, so the switch would not reach the prompt. Use the template's "
                         "own name for the switch.")
    out = {"checked": sorted(kwargs)}
    if render is not None:
        out["changes_prompt"] = render(dict(kwargs)) != render({})
    return out
