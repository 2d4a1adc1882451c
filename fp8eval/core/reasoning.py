"""Thinking text is kept in the records but never scored."""

from __future__ import annotations

import re

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, answer). Handles a closed <think> block, a template that opened <think> in the
    prompt (only `</think>` appears), and an unfinished think block (no answer at all)."""
    if "</think>" in text:
        head, _, answer = text.rpartition("</think>")
        reasoning = head.replace("<think>", "", 1).strip()
        return reasoning, answer.strip()
    if "<think>" in text:
        before, _, thinking = text.partition("<think>")
        return thinking.strip(), before.strip()
    return None, text
