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
