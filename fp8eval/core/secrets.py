"""Credentials never leave memory: one redaction, `redact`, for everything fp8eval writes or prints.

What `redact` hides (each replaced by ***):
- the user-info part of URLs: `http://user:pass@host` -> `http://***@host`, also in Hydra's escaped form
  (`http\\://user\\:pass@host`, how `.hydra/overrides.yaml` and `hydra.yaml` spell an override) and
  with escaped slashes (`http:\\/\\/user:pass@host`, JSON);
- the values of query parameters whose name is in `SECRET_QUERY_KEYS` (any case): `?sig=...`,
  `&api_key=...` (pre-signed URLs, SAS tokens, keys passed in the URL);
- `Bearer <token>`, and the value after a header or field named in `SECRET_FIELDS`
  (`Authorization: ...`, `x-api-key: ...`, `"api_key": "..."`).

Where it is applied (one function, several doors, so no writer can forget it):
- `redact_obj` for JSON written by the CLIs (summary.json, suite.json, perf.json, divergence and
  sensitivity outputs), `write_text` for other text files;
- `guard_std_streams()`: stdout and stderr of every CLI, so prints, warnings, logging and tracebacks
  pass through `redact`;
- the Hydra callback (fp8eval/hydra_callbacks.py) rewrites Hydra's own files: each job's
  `.hydra/{config,hydra,overrides}.yaml`, a sweep's `multirun.yaml`, and at the end of each job every text
  file of its run directory (`redact_tree`).
"""

from __future__ import annotations

import io
import logging
import re
import sys
from pathlib import Path
from typing import Any

# Query parameter names whose values are secrets (compared without case).
SECRET_QUERY_KEYS = (
    "sig", "signature", "auth", "authorization", "token", "access_token", "refresh_token", "id_token",
    "key", "api_key", "apikey", "api-key", "password", "passwd", "pwd", "secret", "client_secret",
    "session", "sessionid", "credential", "credentials", "code",
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature", "x-goog-credential",
)
# Header / field names whose value is a secret wherever they appear as `name: value` or `name=value`.
SECRET_FIELDS = ("authorization", "proxy-authorization", "x-api-key", "api-key", "api_key", "apikey",
                 "x-auth-token", "cookie", "set-cookie", "ocp-apim-subscription-key", "password", "client_secret")

MASK = "***"
_SLASH = r"\\?/"
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*\\?:" + _SLASH + _SLASH + r")(?P<info>[^/\s@'\"<>]+)@")
_QUERY = re.compile(r"(?P<key>[?&;](?:" + "|".join(re.escape(k) for k in SECRET_QUERY_KEYS) + r")=)"
                    r"(?:\\[^\s]|[^&;\s'\",#\\)\]}<>])+", re.IGNORECASE)
_BEARER = re.compile(r"(?P<key>\bBearer(?:\\?[ \t])+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)
_FIELD = re.compile(r"(?P<key>(?<![\w-])(?:" + "|".join(re.escape(k) for k in SECRET_FIELDS) + r")(?![\w-])"
                    r"[\"']?\s*[:=]\s*[\"']?)(?:(?:Bearer|Basic|Token|Digest)(?:\\?[ \t])+)?(?:\\[^\s]|[^\s\"',}\]&;\\])+",
                    re.IGNORECASE)


def redact(text: Any) -> str:
    """`text` with URL credentials, secret query values, bearer tokens and secret header values as ***."""
    s = text.decode("utf-8", "replace") if isinstance(text, (bytes, bytearray)) else str(text)
    if not s:
        return s
    s = _USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", s)
    s = _QUERY.sub(lambda m: f"{m.group('key')}{MASK}", s)
    s = _BEARER.sub(lambda m: f"{m.group('key')}{MASK}", s)
    return _FIELD.sub(lambda m: f"{m.group('key')}{MASK}", s)


def redact_obj(obj: Any) -> Any:
    """A JSON-like tree with every string (keys and values) passed through `redact`."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact_obj(k): redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v) for v in obj]
    return obj


def write_text(path: Path, text: str) -> None:
    """Write `text` redacted to `path` (UTF-8)."""
    Path(path).write_text(redact(text), encoding="utf-8")


def redact_file(path: Path) -> bool:
    """Rewrite one text file redacted, atomically; True when it changed (binary files are left alone)."""
    path = Path(path)
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    clean = redact(text)
    if clean == text:
        return False
    tmp = path.with_name(f".{path.name}.redact.tmp")
    tmp.write_text(clean, encoding="utf-8")
    tmp.replace(path)
    return True


# Text files a run directory holds (not .jsonl: a records file keeps model output verbatim); larger ones
# (none are expected) are skipped, not read whole.
TEXT_SUFFIXES = {".yaml", ".yml", ".json", ".md", ".csv", ".html", ".txt", ".log", ".tsv"}
MAX_REDACT_BYTES = 256 * 1024 * 1024


def redact_files(directory: Path) -> list[Path]:
    """Redact every YAML file of one directory in place (atomic rewrite); the files changed."""
    return [p for p in sorted(Path(directory).glob("*.yaml")) if redact_file(p)]


def redact_tree(directory: Path) -> list[Path]:
    """Redact every text file under `directory` (by suffix, up to MAX_REDACT_BYTES); the files changed."""
    root = Path(directory)
    if not root.is_dir():
        return []
    changed = []
    for path in sorted(root.rglob("*")):
        try:
            ok = path.is_file() and not path.is_symlink() and path.suffix.lower() in TEXT_SUFFIXES \
                and path.stat().st_size <= MAX_REDACT_BYTES
        except OSError:
            continue
        if ok and redact_file(path):
            changed.append(path)
    return changed


class RedactingStream(io.TextIOBase):
    """A text stream that passes every write through `redact` before the stream it wraps."""

    def __init__(self, inner):
        self.inner = inner

    def write(self, s: str) -> int:
        """Write `s` redacted; returns len(s), as callers expect."""
        self.inner.write(redact(s))
        return len(s)

    def flush(self) -> None:
        """Flush the wrapped stream."""
        self.inner.flush()

    def fileno(self) -> int:
        """The wrapped stream's file descriptor."""
        return self.inner.fileno()

    def isatty(self) -> bool:
        """Whether the wrapped stream is a terminal."""
        return self.inner.isatty()

    @property
    def encoding(self):  # noqa: D102 - as the wrapped stream
        return getattr(self.inner, "encoding", "utf-8")

    def __getattr__(self, name):
        return getattr(self.inner, name)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts each record's message (for handlers that write to files)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Replace the record's message by its redacted form; always keep the record."""
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logged as it is
            return True
        record.msg, record.args = redact(message), None
        return True


def guard_std_streams() -> None:
    """Route sys.stdout, sys.stderr and every logging handler through `redact` (idempotent)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, RedactingStream):
            setattr(sys, name, RedactingStream(stream))
    root = logging.getLogger()
    for handler in root.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
    if not any(isinstance(f, RedactingFilter) for f in root.filters):
        root.addFilter(RedactingFilter())
