"""Credentials never leave memory: URLs and texts are redacted before we write or print them.

`redact` hides the user-info part of URLs (`http://user:pass@host` -> `http://***@host`) and the values of
query parameters that carry keys or tokens. The Hydra callback `RedactHydraFiles` applies it to the run's
saved `.hydra/*.yaml`, so a base URL with credentials never reaches disk.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<info>[^/\s@'\"]+)@")
_QUERY = re.compile(r"(?P<key>[?&](?:api[_-]?key|key|token|access[_-]?token|password|secret)=)[^&\s'\"]+",
                    re.IGNORECASE)


def redact(text: Any) -> str:
    """`text` with URL credentials and key-like query values replaced by ***."""
    s = str(text)
    s = _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", s)
    return _QUERY.sub(lambda m: f"{m.group('key')}***", s)


def redact_files(directory: Path) -> list[Path]:
    """Redact every YAML file of a directory in place (atomic rewrite); the files changed."""
    changed = []
    for path in sorted(Path(directory).glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        clean = redact(text)
        if clean != text:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(clean, encoding="utf-8")
            tmp.replace(path)
            changed.append(path)
    return changed
