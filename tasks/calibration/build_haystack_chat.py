"""Rebuild `haystack_chat.jsonl`, the offline calibration set, from the public-domain haystack books.

    python tasks/calibration/build_haystack_chat.py [BOOK_DIR] [OUT]

BOOK_DIR defaults to tasks/niah/haystack (falling back to ../shared/data/niah_haystack). The output is a
pure function of the book files: rerunning it reproduces the shipped file byte for byte (PROVENANCE.md
lists its sha256).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

BOOKS = {  # file stem -> (title, author); fixed order so the output never depends on the file system
    "pg2701_moby_dick": ("Moby-Dick", "Herman Melville"),
    "pg145_middlemarch": ("Middlemarch", "George Eliot"),
    "pg1342_pride_and_prejudice": ("Pride and Prejudice", "Jane Austen"),
    "pg766_david_copperfield": ("David Copperfield", "Charles Dickens"),
    "pg1023_bleak_house": ("Bleak House", "Charles Dickens"),
    "pg98_a_tale_of_two_cities": ("A Tale of Two Cities", "Charles Dickens"),
}
ROWS_PER_BOOK = 86  # 6 x 86 = 516 >= 512, llm-compressor's default sample count
PASSAGE_CHARS = 1000  # per turn; about 250 tokens each with a Llama-style BPE
# Chat shapes vary so the calibration sees more than one kind of turn; which one is used is fixed by the
# row index, not random.
PROMPTS = [
    ("Continue this passage from {title} by {author} in the same style.\n\n{a}", "{b}"),
    ("Here is an excerpt from {title} ({author}). What happens next?\n\n{a}", "Next, the text goes on:\n\n{b}"),
    ("Read the following text carefully.\n\n{a}\n\nNow write the next part of the story.", "{b}"),
    ("I am studying {author}. Can you show me how this scene from {title} continues?\n\n{a}", "Certainly. The scene continues:\n\n{b}"),
]
_START = re.compile(r"^\*\*\* ?START OF.*$", re.M)
_END = re.compile(r"^\*\*\* ?END OF.*$", re.M)


def book_body(path: Path) -> str:
    text = path.read_text(encoding="utf-8-sig").replace("\r\n", "\n")
    start, end = _START.search(text), _END.search(text)
    if not (start and end):
        raise ValueError(f"{path}: no Project Gutenberg START/END markers")
    return text[start.end() : end.start()]


def paragraphs(body: str) -> list[str]:
    paras = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", body)]
    # Headings, tables of contents and one-liners carry little signal; keep prose paragraphs. Paragraphs
    # naming the eBook's distributor are dropped too: its licence lets the texts be reused freely once
    # such references are gone.
    return [p for p in paras if len(p) >= 200 and "gutenberg" not in p.lower()]


def take(paras: list[str], i: int, limit: int) -> tuple[str, int]:
    """Whole paragraphs from i until `limit` chars (at least one); returns (text, next index)."""
    out: list[str] = []
    size = 0
    while i < len(paras) and (not out or size + len(paras[i]) <= limit):
        out.append(paras[i])
        size += len(paras[i]) + 2
        i += 1
    return "\n\n".join(out)[: limit * 2], i


def rows_for_book(stem: str, body: str) -> list[dict]:
    title, author = BOOKS[stem]
    paras = paragraphs(body)
    rows = []
    for r in range(ROWS_PER_BOOK):
        i = (r * len(paras)) // ROWS_PER_BOOK  # evenly spread over the book
        a, j = take(paras, i, PASSAGE_CHARS)
        b, _ = take(paras, j, PASSAGE_CHARS)
        if not b:
            continue
        user, assistant = PROMPTS[r % len(PROMPTS)]
        fields = {"title": title, "author": author, "a": a, "b": b}
        rows.append(
            {
                "id": f"{stem.split('_')[0]}-{r:03d}",
                "source": f"{title} by {author} (public domain; eBook #{stem.split('_')[0][2:]}), prose paragraphs from {i}",
                "messages": [
                    {"role": "user", "content": user.format(**fields)},
                    {"role": "assistant", "content": assistant.format(**fields)},
                ],
            }
        )
    return rows


def main(argv: list[str]) -> None:
    here = Path(__file__).resolve().parent
    repo = here.parent.parent
    default_dir = repo / "tasks" / "niah" / "haystack"
    if not default_dir.is_dir():
        default_dir = repo.parent / "shared" / "data" / "niah_haystack"
    book_dir = Path(argv[1]) if len(argv) > 1 else default_dir
    out = Path(argv[2]) if len(argv) > 2 else here / "haystack_chat.jsonl"
    rows = []
    for stem in BOOKS:
        rows.extend(rows_for_book(stem, book_body(book_dir / f"{stem}.txt")))
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(rows)} rows -> {out}")


if __name__ == "__main__":
    main(sys.argv)
