"""Writing result JSON that is valid JSON: never NaN or Infinity (`allow_nan=False`), replaced atomically,
and a disk problem as one line (`Fp8evalError`) instead of a traceback."""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path
from typing import Any

from fp8eval.core.errors import Fp8evalError


def non_finite_paths(obj: Any, where: str = "") -> list[str]:
    """Dotted paths of every NaN/inf float inside `obj`."""
    if isinstance(obj, float):
        return [] if math.isfinite(obj) else [where or "."]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in non_finite_paths(v, f"{where}.{k}" if where else str(k))]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in non_finite_paths(v, f"{where}[{i}]")]
    return []


def write_json(path: Path, obj: Any) -> None:
    """Write `obj` as indented JSON to `path` (temp file + rename). Raises Fp8evalError (one line) when a
    value is NaN/inf (naming it) or the file cannot be written (naming the path and the reason)."""
    path = Path(path)
    try:
        text = json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n"
    except ValueError:
        bad = non_finite_paths(obj)
        raise Fp8evalError(f"{path.name} not written: {', '.join(bad[:5]) or 'a value'} is not a finite number "
                           "(a bug upstream; the records are kept)") from None
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        name = errno.errorcode.get(e.errno or 0, str(e.errno))
        raise Fp8evalError(f"cannot write {e.filename or path}: {e.strerror or e} ({name}); the records are kept, "
                           "fix it and rerun the same command (it sends no request that is already recorded)") from None
