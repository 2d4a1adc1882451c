"""Canonical JSON and the sha256 fingerprints built from it (arm fingerprints, cache keys)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(obj: Any) -> str:
    """One text per value: sorted keys, no spaces, UTF-8 kept; what every fingerprint hashes."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def fingerprint_hash(material: dict) -> str:
    """sha256 hex of the canonical JSON of `material`."""
    return hashlib.sha256(canonical_json(material).encode("utf-8")).hexdigest()
