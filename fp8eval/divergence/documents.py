"""The passages the divergence probe prefills: token ids cut from the shipped haystack books."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

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


class FileText:
    """A text file read only as far as it is needed (`prefix`): a 40 MB file measured at 64 tokens reads and
    tokenizes a few KB, not the whole file."""

    def __init__(self, path: Path):
        self.path = path

    def prefix(self, chars: int) -> tuple[str, bool]:
        """The first `chars` characters and whether that is the whole text."""
        with open(self.path, encoding="utf-8", errors="replace") as f:
            text = f.read(chars)
            return text, len(text) < chars or not f.read(1)


def read_texts(paths: list[str]) -> list[tuple[str, str | FileText]]:
    """The user's own texts: a `.jsonl` file gives one text per line (a JSON string, or an object with one of the
    fields prompt, text, content, or OpenAI-style messages whose contents are joined), any other file is one text
    (a `FileText`, read only as far as its passages need). Returns (name, text) pairs, name = file name (and line
    number); ValueError for a missing file or a bad line. Files are streamed, never read whole at once."""
    out: list[tuple[str, str | FileText]] = []
    for raw in paths:
        path = Path(str(raw)).expanduser()
        if not path.is_file():
            raise ValueError(f"divergence.texts: no such file: {raw}")
        if path.suffix != ".jsonl":
            out.append((path.name, FileText(path)))
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            out.extend(_jsonl_texts(path, f))
    return out


def _jsonl_texts(path: Path, lines) -> list[tuple[str, str]]:
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise ValueError(f"divergence.texts: {path.name} line {n} is not JSON ({e})") from None
        text = _text_of(obj)
        if text is None:
            raise ValueError(f"divergence.texts: {path.name} line {n} has none of the fields "
                             f"{', '.join(TEXT_FIELDS)} (or messages)")
        out.append((f"{path.name}:{n}", text))
    return out


# Characters read per token needed at first (the books' passages take 8), and tokens beyond the longest length
# that a prefix must give before its first tokens are taken as the whole text's (a word cut at the prefix's end
# changes only its last tokens).
CHARS_PER_TOKEN, MARGIN = 8, 16


def _token_ids(tokenizer, text: str | FileText, need: int) -> list[int]:
    """The text's token ids, at most `need` + MARGIN of them: a growing prefix is tokenized until it gives that
    many or is the whole text, so memory and time follow the tokens used, not the file's size."""
    chars = max(4096, CHARS_PER_TOKEN * (need + MARGIN))
    while True:
        piece, whole = text.prefix(chars) if isinstance(text, FileText) else (text[:chars], len(text) <= chars)
        ids = tokenizer(piece, add_special_tokens=True)["input_ids"]
        if whole:
            return list(ids)
        if len(ids) >= need + MARGIN:
            return list(ids[:need + MARGIN])
        chars *= 4


TEXT_FIELDS = ("prompt", "text", "content")


def _text_of(obj) -> str | None:
    if isinstance(obj, str):
        return obj
    if not isinstance(obj, dict):
        return None
    for k in TEXT_FIELDS:
        if isinstance(obj.get(k), str):
            return obj[k]
    msgs = obj.get("messages")
    if isinstance(msgs, list):
        parts = [m.get("content") for m in msgs if isinstance(m, dict) and isinstance(m.get("content"), str)]
        return "\n\n".join(parts) if parts else None
    return None


def text_passages(tokenizer, texts: list[tuple[str, str]], lengths: list[int]) -> tuple[list[Passage], dict]:
    """Passages from the user's texts: each text cut to every requested length it reaches; a text shorter than
    every length is used whole (its own length), one shorter than 2 tokens is skipped. Returns the passages and
    the counts {texts, passages, used_whole, skipped_short}, so nothing is dropped unseen."""
    if not lengths:  # never a whole text instead: the caller has no length a passage may have
        raise ValueError("divergence.texts: no length to cut the texts to (every divergence.lengths is above "
                         "model.max_model_len - 1)")
    out, whole, short = [], 0, 0
    for name, text in texts:
        ids = _token_ids(tokenizer, text, max(lengths))
        reach = [n for n in lengths if n <= len(ids)]
        if not reach:
            if len(ids) < 2:
                short += 1
                continue
            reach, whole = [len(ids)], whole + 1
        for i, n in enumerate(reach):
            out.append(Passage(n, i, name, 0, tuple(int(t) for t in ids[:n])))
    return out, {"texts": len(texts), "passages": len(out), "used_whole": whole, "skipped_short": short}
