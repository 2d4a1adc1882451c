"""Paired determinism: seeds and permutations are pure functions of (sample id, repeat, base seed).

sha256, never Python's salted hash() or a global RNG, so both arms of a pairing (and every rerun on
any machine) see the same seed for the same (sample, repeat).
"""

from __future__ import annotations

import hashlib


def _digest(*parts: object) -> bytes:
    text = "\x1f".join(str(p) for p in parts)
    return hashlib.sha256(text.encode("utf-8")).digest()


MAX_REPEATS = 1 << 20
_SEED_SPAN = (1 << 31) - MAX_REPEATS


def derive_seed(sample_id: str, repeat: int, base_seed: int) -> int:
    """A 31-bit seed (vLLM and torch accept it everywhere): the sample's sha256-derived seed plus the
    repeat index. Consecutive on purpose: vLLM turns a request with `n` and `seed=s` into child requests
    seeded s, s+1, ..., s+n-1, so a request for repeats r..r+n-1 seeded with repeat r's seed gives every
    repeat exactly the seed its record states, however the runner grouped the missing repeats."""
    if not 0 <= repeat < MAX_REPEATS:
        raise ValueError(f"repeat {repeat} outside [0, {MAX_REPEATS})")
    return int.from_bytes(_digest("seed", base_seed, sample_id)[:8], "big") % _SEED_SPAN + repeat


def permutation(n: int, *key: object) -> list[int]:
    """A permutation of range(n) determined by key (Fisher-Yates driven by a sha256 counter stream)."""
    order = list(range(n))
    counter = 0
    for i in range(n - 1, 0, -1):
        r = int.from_bytes(_digest("perm", counter, *key)[:8], "big")
        counter += 1
        j = r % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def rng_for(*key: object):
    """A local random.Random seeded from key, for tasks that need several draws."""
    import random

    return random.Random(int.from_bytes(_digest("rng", *key)[:8], "big"))
