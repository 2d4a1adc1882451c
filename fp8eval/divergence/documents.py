"""The passages the divergence probe prefills: token ids cut from the shipped haystack books."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from fp8eval.tasks.niah.haystack import BOOKS, HAYSTACK_DIR, book_body


@dataclass(frozen=True)
class Passage:
    length: int  # tokens, BOS included
    index: int  # which passage of this length
    book: str
    char_offset: int
    ids: tuple[int, ...]

    @property
    def key(self) -> str:
        """Names the passage by content (the token ids), so a changed tokenizer or book is never reused."""
        return hashlib.sha256(np.asarray(self.ids, dtype=np.int64).tobytes()).hexdigest()[:16]


def load_tokenizer(model_cfg):
    """The model's own tokenizer (the embedded models' converted directory, else the hub id)."""
    from transformers import AutoTokenizer

    from fp8eval.models import local_model_dir

    return AutoTokenizer.from_pretrained(str(local_model_dir(model_cfg)), revision=model_cfg.revision)


def passages(tokenizer, lengths: list[int], documents: int) -> list[Passage]:
    """`documents` passages of each length, each from its own book where there are enough books (a book
    used again starts further in), tokenized with the tokenizer's special tokens and cut to `length` tokens.

    Every passage is exactly `length` tokens: a book too short for it raises instead of a shorter passage.
    """
    out = []
    for li, length in enumerate(lengths):
        for d in range(documents):
            slot = li * documents + d
            book = BOOKS[slot % len(BOOKS)]
            body = book_body(str(HAYSTACK_DIR / book))
            # A reused book starts 200k characters further on per round (the books are 0.7-2 M characters).
            offset = (slot // len(BOOKS)) * 200_000
            text = body[offset:offset + 8 * length]
            ids = tokenizer(text, add_special_tokens=True)["input_ids"]
            if len(ids) < length:
                raise ValueError(f"{book} from character {offset} gives only {len(ids)} tokens; "
                                 f"divergence.lengths asks for {length}")
            out.append(Passage(length, d, book, offset, tuple(int(i) for i in ids[:length])))
    return out
