"""Reading group labels: families, token sizes, ordering.

Tasks tag each record with labels such as `8k` (an MRCR bucket), `ctx=4096` and `depth=50` (a needle
cell) or `needles=2`. A label `key=value` belongs to family `key`; a bare label to family `bucket`.
"""

from __future__ import annotations

import re

BARE_FAMILY = "bucket"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")
# Families whose values are context lengths (x axis of the bucket plots, rows of needle heatmaps).
LENGTH_FAMILIES = ("bucket", "ctx", "context", "length", "len", "tokens")
DEPTH_FAMILIES = ("depth", "depth_pct", "position")


def split_label(label: str) -> tuple[str, str]:
    """(family, value) of a group label: `key=value` -> (key, value), a bare label -> ('bucket', label)."""
    if "=" in label:
        key, _, value = label.partition("=")
        return key.strip(), value.strip()
    return BARE_FAMILY, label.strip()


def parse_size(value: str) -> float | None:
    """`8k` -> 8192, `1M` -> 1048576, `4096` -> 4096; None when it is not a size."""
    m = _SIZE.match(value)
    if not m:
        return None
    number, unit = float(m.group(1)), m.group(2).lower()
    return number * {"": 1, "k": 1024, "m": 1024 * 1024}[unit]


def parse_number(value: str) -> float | None:
    """A label value as a number (a size like `8k`, or a percentage like `50%`); None when it is not one."""
    v = value.strip().rstrip("%")
    return parse_size(v)


def label_sort_key(label: str) -> tuple:
    """Family first, then numeric value when there is one, so `8k` < `16k` < `1M` and `ctx=512` < `ctx=4096`."""
    family, value = split_label(label)
    num = parse_number(value)
    return (family, 0 if num is not None else 1, num if num is not None else 0.0, value)


def families(labels) -> dict[str, list[str]]:
    """{family: its labels in label order} of these labels."""
    out: dict[str, list[str]] = {}
    for label in sorted(set(labels), key=label_sort_key):
        out.setdefault(split_label(label)[0], []).append(label)
    return out


def length_family(labels) -> str | None:
    """The family of context-length buckets among these labels, if every value in it is a size."""
    fams = families(labels)
    for name in LENGTH_FAMILIES:
        values = fams.get(name)
        if values and len(values) >= 2 and all(parse_size(split_label(v)[1]) is not None for v in values):
            return name
    return None


def depth_family(labels) -> str | None:
    """The family of needle depths among these labels (two or more values, all numbers), else None."""
    fams = families(labels)
    for name in DEPTH_FAMILIES:
        values = fams.get(name)
        if values and len(values) >= 2 and all(parse_number(split_label(v)[1]) is not None for v in values):
            return name
    return None


def cell_key(groups) -> str:
    """The disjoint cell a record belongs to: all its labels together (e.g. `ctx=4096|depth=50`).

    Single labels overlap (every needle record is in one ctx= and one depth= group); cells partition
    the samples, which is what a sign test across buckets needs."""
    return "|".join(sorted(groups, key=label_sort_key)) if groups else ""


def short_size(tokens: float) -> str:
    """A token count written short: 8192 -> '8k', 1048576 -> '1M', else the integer."""
    if tokens >= 1024 * 1024 and tokens % (1024 * 1024) == 0:
        return f"{int(tokens // (1024 * 1024))}M"
    if tokens >= 1024 and tokens % 1024 == 0:
        return f"{int(tokens // 1024)}k"
    return f"{int(tokens)}"
