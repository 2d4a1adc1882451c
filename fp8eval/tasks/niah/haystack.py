"""Filler text for long-context prompts: public-domain novels shipped in tasks/niah/haystack/.

Each book keeps its Project Gutenberg licence in the shipped file; only the body between the
`*** START OF` and `*** END OF` marker lines is used, which PG's licence allows without restriction.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from fp8eval.tasks.base import TASK_DATA_ROOT

HAYSTACK_DIR = TASK_DATA_ROOT / "niah" / "haystack"
# A fixed order, so the same length always means the same text.
BOOKS = (
    "pg2701_moby_dick.txt",
    "pg145_middlemarch.txt",
    "pg1342_pride_and_prejudice.txt",
    "pg766_david_copperfield.txt",
    "pg1023_bleak_house.txt",
    "pg98_a_tale_of_two_cities.txt",
)
_START = re.compile(r"^\*\*\* ?START OF.*$", re.MULTILINE)
_END = re.compile(r"^\*\*\* ?END OF.*$", re.MULTILINE)


@lru_cache(maxsize=None)
def book_body(path: str) -> str:
    """A Project Gutenberg book's text between its START and END markers, hard wraps joined into paragraphs (cached;
    ValueError without the markers)."""
    text = Path(path).read_text(encoding="utf-8-sig").replace("\r\n", "\n")
    start, end = _START.search(text), _END.search(text)
    if not start or not end:
        raise ValueError(f"{path}: no Project Gutenberg START/END markers")
    body = text[start.end():end.start()].strip()
    # Collapse the hard line wraps of the PG text into paragraphs: fewer tokens spent on newlines.
    paragraphs = [" ".join(p.split()) for p in body.split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p)


def haystack_text(n_chars: int, directory: Path | None = None) -> str:
    """The first n_chars of the concatenated books (cycling if more is asked than exists)."""
    d = Path(directory) if directory else HAYSTACK_DIR
    parts: list[str] = []
    have = 0
    while have < n_chars:
        for name in BOOKS:
            path = d / name
            if not path.exists():
                raise FileNotFoundError(f"haystack book {path} is missing")
            body = book_body(str(path))
            parts.append(body)
            have += len(body) + 2
            if have >= n_chars:
                break
    if not parts:
        return ""
    # "\n\n".join(parts)[:n_chars] without copying the whole last book: every part but the last is used whole.
    head = "\n\n".join(parts[:-1]) + "\n\n" if len(parts) > 1 else ""
    return (head + parts[-1][:max(0, n_chars - len(head))])[:n_chars]


def sentence_boundary_before(text: str, pos: int) -> int:
    """The start of the sentence containing pos (after '. ', '? ', '! ' or a paragraph break)."""
    if pos <= 0:
        return 0
    if pos >= len(text):
        return len(text)
    best = max(text.rfind(". ", 0, pos), text.rfind("? ", 0, pos), text.rfind("! ", 0, pos))
    para = text.rfind("\n\n", 0, pos)
    if para > best:
        return para + 2
    return best + 2 if best >= 0 else 0
