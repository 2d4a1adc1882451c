"""Synthetic rows in the exact openai/mrcr format, for running and testing MRCR with no hub access.

A row is a conversation: the first user message holds the few-shot examples and the first ask, then
user asks ("write a poem about tapirs") alternate with assistant replies, N of the asks (the needles)
share one form and topic, and the last user message asks to prepend a hash to the k-th of them. The
replies are passages of the public-domain haystack books, not GPT-4o text, so these rows measure the
same retrieval mechanics but are not the benchmark: every row says `synthetic: true` and
`date_added: "synthetic"`, and the task prints that in its notes.

Deterministic: a row depends only on (seed, needles, bin, index) and the book files, through
fp8eval.seeds.rng_for. Sizes are hit by counting o200k tokens of each message as it is added, so every
row lands in the bin it was generated for (checked).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from fp8eval.core.paths import PROJECT_ROOT, TASK_DATA_ROOT
from fp8eval.core.seeds import rng_for
from fp8eval.metrics.auc import MRCR_BINS, MRCR_LABELS, bucket_of

GENERATOR_VERSION = "1"
PREAMBLE = "Here are some examples of conversations succeeded by a follow-up question answered correctly:"
FORMS = (
    "poem", "short story", "riddle", "essay", "blog post", "social media post", "speech", "letter",
    "limerick", "news article", "diary entry", "song",
)
TOPICS = (
    "tapirs", "lighthouses", "glaciers", "copper mines", "owls", "tea ceremonies", "bridges", "comets",
    "coral reefs", "trains", "bees", "deserts", "violins", "chess", "volcanoes", "libraries", "foxes",
    "harbors", "clocks", "salt", "rivers", "kites", "mushrooms", "winter", "lanterns", "whales",
)
REPLY_CHARS = (1200, 4000)  # GPT-4o replies in the real set run 159 to 3.89k chars
HASH_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
COLUMNS = (
    "prompt", "answer", "random_string_to_prepend", "n_needles", "desired_msg_index",
    "total_messages", "n_chars", "date_added", "synthetic",
)


def default_haystack_dir() -> Path:
    """The project's shipped books, else the shared data copy beside the repository."""
    root = PROJECT_ROOT
    for candidate in (TASK_DATA_ROOT / "niah" / "haystack", root.parent / "shared" / "data" / "niah_haystack"):
        if any(candidate.glob("pg*.txt")):
            return candidate
    raise FileNotFoundError(
        f"no haystack books (pg*.txt) in {TASK_DATA_ROOT / 'niah/haystack'} or "
        f"{root.parent / 'shared/data/niah_haystack'}"
    )


_START = re.compile(r"^\*\*\* ?START OF.*$", re.MULTILINE)
_END = re.compile(r"^\*\*\* ?END OF.*$", re.MULTILINE)


def book_body(path: Path) -> str:
    """A Project Gutenberg book's text between its START and END markers (ValueError without them)."""
    text = path.read_text(encoding="utf-8-sig").replace("\r\n", "\n")
    start, end = _START.search(text), _END.search(text)
    if start is None or end is None:
        raise ValueError(f"{path}: no Project Gutenberg START/END markers")
    return text[start.end() : end.start()]


def load_paragraphs(haystack_dir: Path) -> list[str]:
    """Non-empty paragraphs of all books, in file-name order (the order is part of determinism)."""
    paragraphs: list[str] = []
    for path in sorted(haystack_dir.glob("pg*.txt")):
        for para in book_body(path).split("\n\n"):
            para = " ".join(para.split())
            if len(para) >= 40:  # drop headings, chapter numbers, blank runs
                paragraphs.append(para)
    return paragraphs


def ordinal(k: int) -> str:
    """1 -> '1st', 2 -> '2nd', 11 -> '11th', ..."""
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def final_ask(hash_: str, k: int, form: str, topic: str) -> str:
    """The last user message of a synthetic conversation, worded as MRCR's: prepend `hash_` to the k-th `form` about
    `topic`."""
    return (
        f"Prepend {hash_} to the {ordinal(k)} (1 indexed) {form} about {topic}. "
        "Do not include any other text in your response."
    )


@dataclass
class _Filler:
    paragraphs: list[str]
    pos: int

    def reply(self, rng) -> str:
        """Consecutive paragraphs until a drawn length is reached (wrapping around the books)."""
        want = rng.randint(*REPLY_CHARS)
        parts: list[str] = []
        size = 0
        while size < want:
            para = self.paragraphs[self.pos % len(self.paragraphs)]
            self.pos += 1
            parts.append(para)
            size += len(para) + 2
        return "\n\n".join(parts)


def _few_shot(rng, filler: _Filler) -> str:
    form, topic = rng.choice(FORMS), rng.choice(TOPICS)
    other = rng.choice([t for t in TOPICS if t != topic])
    hash_ = "".join(rng.choice(HASH_ALPHABET) for _ in range(10))
    first, second, distractor = filler.reply(rng)[:600], filler.reply(rng)[:600], filler.reply(rng)[:600]
    turns = [
        (f"write a {form} about {topic}", first),
        (f"write a {form} about {other}", distractor),
        (f"write a {form} about {topic}", second),
        (final_ask(hash_, 2, form, topic), hash_ + second),
    ]
    body = "\n".join(f"User: {ask}\nAssistant: {reply}" for ask, reply in turns)
    return f"{PREAMBLE}\n\n======EXAMPLE======\n{body}\n======END EXAMPLE======"


def synth_row(
    bin_label: str, n_needles: int, index: int, seed: int, paragraphs: list[str], count_tokens
) -> dict:
    """One row of bin `bin_label`; count_tokens(text) -> o200k tokens (fp8eval.o200k.count_tokens)."""
    bin_ = MRCR_BINS[MRCR_LABELS.index(bin_label)]
    rng = rng_for("mrcr-synth", GENERATOR_VERSION, seed, n_needles, bin_label, index)
    width = bin_.hi - bin_.lo
    # The last pair added can overshoot by about one reply (~1k tokens): aim low enough in the bin.
    target = rng.randint(bin_.lo + width // 10, bin_.lo + (width * 7) // 10)
    filler = _Filler(paragraphs, rng.randrange(len(paragraphs)))

    form, topic = rng.choice(FORMS), rng.choice(TOPICS)
    hash_ = "".join(rng.choice(HASH_ALPHABET) for _ in range(10))
    k = rng.randint(1, n_needles)
    preamble = _few_shot(rng, filler)
    closing = final_ask(hash_, k, form, topic)
    needle_ask = f"write a {form} about {topic}"

    def distractor_ask() -> str:
        while True:
            f, t = rng.choice(FORMS), rng.choice(TOPICS)
            if (f, t) != (form, topic):  # same form or same topic is fine: those are the hard ones
                return f"write a {f} about {t}"

    pairs: list[list[str]] = []
    total = count_tokens(preamble + "\n\n") + count_tokens(closing)
    while total < target or len(pairs) < n_needles:
        ask, reply = distractor_ask(), filler.reply(rng)
        pairs.append([ask, reply])
        total += count_tokens(ask) + count_tokens(reply)
    for i in sorted(rng.sample(range(len(pairs)), n_needles)):
        pairs[i][0] = needle_ask
    needle_pairs = [i for i, (ask, _) in enumerate(pairs) if ask == needle_ask]
    target_pair = needle_pairs[k - 1]

    messages: list[dict] = []
    for i, (ask, reply) in enumerate(pairs):
        messages.append({"role": "user", "content": f"{preamble}\n\n{ask}" if i == 0 else ask})
        messages.append({"role": "assistant", "content": reply})
    messages.append({"role": "user", "content": closing})
    desired = 2 * target_pair + 1  # 0-based position of that assistant reply in the message list

    n_tokens = sum(count_tokens(m["content"]) for m in messages)
    if bucket_of(n_tokens) != bin_label:
        raise AssertionError(f"synthetic row landed in {bucket_of(n_tokens)} ({n_tokens} tok), not {bin_label}")
    return {
        "prompt": json.dumps(messages, ensure_ascii=False),
        "answer": hash_ + messages[desired]["content"],
        "random_string_to_prepend": hash_,
        "n_needles": n_needles,
        "desired_msg_index": desired,
        "total_messages": len(messages),
        "n_chars": sum(len(m["content"]) for m in messages),
        "date_added": "synthetic",
        "synthetic": True,
    }


def synth_rows(
    bins: Iterable[str],
    needles: Iterable[int],
    rows_per_bin: int,
    seed: int = 0,
    haystack_dir: Path | None = None,
    count_tokens=None,
) -> Iterator[dict]:
    """rows_per_bin rows for every (needle count, bin), needle counts outer, bins in size order."""
    if count_tokens is None:
        from fp8eval.tasks.mrcr.o200k import count_tokens
    bins = list(bins)
    unknown = [b for b in bins if b not in MRCR_LABELS]
    if unknown:
        raise ValueError(f"unknown MRCR bins {unknown}; valid: {list(MRCR_LABELS)}")
    paragraphs = load_paragraphs(haystack_dir or default_haystack_dir())
    for n in needles:
        for label in sorted(bins, key=MRCR_LABELS.index):
            for i in range(rows_per_bin):
                yield synth_row(label, n, i, seed, paragraphs, count_tokens)


def write_jsonl(rows: Iterable[dict], path: Path) -> Path:
    """Write rows one at a time (a 1M-token row is ~4 MB), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


_FINAL = re.compile(
    r"Prepend (?P<hash>\S+) to the (?P<k>\d+)(?:st|nd|rd|th) \(1 indexed\) (?P<form>.+?) about "
    r"(?P<topic>.+?)\. Do not include any other text in your response\.\s*$"
)


def oracle_answer(messages: list[dict]) -> str:
    """What a perfect model answers: the hash + the reply to the k-th matching ask. For tests (the
    fake engine's `module:function` scripts) and for checking generated rows."""
    m = _FINAL.search(messages[-1]["content"])
    if m is None:
        return ""
    ask = f"write a {m.group('form')} about {m.group('topic')}"
    seen = 0
    for i, msg in enumerate(messages[:-1]):
        if msg["role"] == "user" and (msg["content"] == ask or msg["content"].endswith("\n\n" + ask)):
            seen += 1
            if seen == int(m.group("k")) and i + 1 < len(messages):
                return m.group("hash") + messages[i + 1]["content"]
    return ""


def fake_engine_oracle(request, sample_index: int) -> str:
    """`engine.script=fp8eval.tasks.mrcr.synth:fake_engine_oracle` for the fake engine."""
    return oracle_answer(list(request.messages))
