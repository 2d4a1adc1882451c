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

# Query parameter names whose values are secrets (compared without case), besides every name `secret_name` accepts.
SECRET_QUERY_KEYS = (
    "sig", "signature", "auth", "authorization", "token", "access_token", "refresh_token", "id_token",
    "key", "api_key", "apikey", "api-key", "password", "passwd", "pwd", "secret", "client_secret",
    "session", "sessionid", "credential", "credentials", "code",
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature", "x-goog-credential",
)
# A header, field, option or query name is a secret's when its last word is one of these (`hf_token`,
# `X-Access-Token`, `Authorization`, `client_secret`), or its last two words one of SECRET_PAIRS (`api_key`,
# `X-Api-Key`, `apiKey`, `ocp-apim-subscription-key`). Words: split at `_`, `-`, `.` and lower-to-upper case.
SECRET_WORDS = frozenset({
    "token", "secret", "password", "passwd", "pwd", "passphrase", "apikey", "cookie", "credential", "credentials",
    "signature", "authorization", "auth", "sig", "pat", "bearer"})
SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("secret", "key"), ("private", "key"),
                          ("subscription", "key"), ("session", "id"), ("auth", "key"), ("account", "key"),
                          ("master", "key"), ("sas", "key")})
# ... or its last word ends with one of these (`accesstoken`, `refreshtoken`, `dbpassword`, `openaiapikey`).
SECRET_SUFFIXES = ("token", "secret", "password", "passwd", "apikey")
SECRET_FIELDS = ("authorization", "proxy-authorization", "x-api-key", "api-key", "api_key", "apikey",
                 "x-auth-token", "cookie", "set-cookie", "ocp-apim-subscription-key", "password", "client_secret")

MASK = "***"
_SLASH = r"\\?/"
# user-info: everything up to the last `@` before the host (any character but `/` and white space: a `'`, a raw
# `@`, an escaped `\:` of Hydra's files)
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*\\?:" + _SLASH + _SLASH + r")(?P<info>[^/\s]+)@")
_QUERY = re.compile(r"(?P<key>[?&;](?P<name>[\w.~%+-]+)=)(?P<value>(?:\\[^\s]|[^&;\s'\",#\\)\]}<>])+)")
_BEARER = re.compile(r"(?P<key>\b(?:Bearer|Basic|Token)(?:\\?[ \t])+)(?P<value>[A-Za-z0-9._~+/=-]{4,})")
# `name: value`, `name=value`, `"name": "value"`, `'name': 'value'`, `--name=value`, `+a.b.Name=value`
# The endings of names that may be a secret's (found with str.find: a large summary or report is scanned in C),
# then the separator and opening quote after the name; the name is the run of [\w.-] before it (`_fields`).
_NAME_ENDS = ("token", "secret", "password", "passwd", "pwd", "passphrase", "key", "cookie", "credential",
              "credentials", "signature", "authorization", "auth", "sig", "pat", "bearer", "sessionid", "session_id",
              "session-id")
_AFTER_NAME = re.compile(r"(?P<sep>(?:''|\\?[\"'])?[ \t]*\\?[:=][ \t]*)(?P<quote>''|\\?[\"']|)")
# a command-line flag and its value, also as list items: `--api-key SECRET`, `--api-key=SECRET`, `'--api-key', 'SECRET'`
_FLAG = re.compile(r"(?P<key>(?<![\w-])--(?P<name>[A-Za-z][\w-]*)(?:=|\\?[ \t]+|(?:''|\\?[\"'])?,[ \t]*(?:''|\\?[\"'])?))"
                   r"(?P<value>[^-\s\"',\]][^\s\"',\]]*)")
_SCHEME = re.compile(r"(?:(?:Bearer|Basic|Token|Digest)(?:\\?[ \t])+)?", re.IGNORECASE)
_VALUE = {'"': re.compile(r'(?:\\.|[^"\\\n])+'), "'": re.compile(r"(?:''|[^'\n])+"),
          "''": re.compile(r"(?:[^'\n]|'(?!'))+"),
          '\\"': re.compile(r'(?:\\[^"]|[^"\\\n])+'), "\\'": re.compile(r"(?:\\[^']|[^'\\\n])+"),
          "": re.compile(r"(?:\\[^\s]|[^\s\"',}\]&;\\])+")}
_PLAIN = re.compile(r"-?[\d.]+(?:[eE][+-]?\d+)?|null|none|true|false|~|\*\*\*|\$\{[^}]*\}", re.IGNORECASE)
# Values that are secrets by their shape, wherever they stand (hub, OpenAI, GitHub, Slack, AWS tokens).
_SHAPES = re.compile(r"\b(?:hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{30,}"
                     r"|xox[abpr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16})\b")
_SHAPE_MARKS = ("hf_", "sk-", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "xox", "AKIA")
# Every secret value seen once (by a form above, in argv or in a secret-named environment variable) is masked
# wherever it appears again, in any spelling (`learn`).
_LEARNED: dict[str, None] = {}
_MIN_LEARNED = 4


def _words(name: str) -> list[str]:
    last = name.rsplit(".", 1)[-1]
    return re.findall(r"[a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", last).lower())


def secret_name(name: str) -> bool:
    """Whether a header, field, option or environment variable of this name holds a secret."""
    words = _words(name)
    if not words:
        return False
    return (words[-1] in SECRET_WORDS or tuple(words[-2:]) in SECRET_PAIRS or name.lower() in SECRET_FIELDS
            or words[-1].endswith(SECRET_SUFFIXES))


def learn(value: str) -> None:
    """Remember a secret value: it is masked wherever it appears from now on (raw, URL-quoted, JSON- or
    YAML-escaped, as Hydra escapes an override)."""
    from urllib.parse import quote, unquote

    value = str(value)
    if len(value) < _MIN_LEARNED or MASK in value or _PLAIN.fullmatch(value):
        return
    json_form = __import__("json").dumps(value)[1:-1]
    for form in {value, unquote(value), quote(value, safe=""), quote(value), json_form, value.replace("'", "''"),
                 re.sub(r"([\\:=,'\" \[\]{}()])", r"\\\1", value)}:
        if len(form) >= _MIN_LEARNED:
            _LEARNED[form] = None


def forget_learned() -> None:
    """Forget every learned secret value (a new run in the same process: tests, notebooks)."""
    _LEARNED.clear()


# Environment variables whose names read as secret-like but are not: the shell's working directories ("pwd" is
# also short for password). Learned, they masked every path under the working directory.
NOT_SECRET_ENV = frozenset({"PWD", "OLDPWD"})


def learn_from_environment(environ: Any = None) -> None:
    """Learn the values of environment variables whose names are secret-like (HF_TOKEN, OPENAI_API_KEY, ...)."""
    import os

    for name, value in (os.environ if environ is None else environ).items():
        if value and secret_name(name) and name not in NOT_SECRET_ENV:
            learn(value)


def _name_ends(s: str) -> list[int]:
    """Positions right after an occurrence of one of _NAME_ENDS (any case), in order."""
    low, ends = s.lower(), set()
    for word in _NAME_ENDS:
        i = low.find(word)
        while i >= 0:
            ends.add(i + len(word))
            i = low.find(word, i + 1)
    return sorted(ends)


def _fields(s: str) -> str:
    out, pos = [], 0
    for end in _name_ends(s):
        m = _AFTER_NAME.match(s, end)
        if m is None or end < pos:
            continue
        at = m.end()
        quote = m.group("quote") or ""
        if not quote:
            at = _SCHEME.match(s, at).end()
        v = _VALUE[quote].match(s, at)
        if v is None or _PLAIN.fullmatch(v.group(0)) or v.group(0).startswith(MASK):
            continue  # (most candidates in a summary: `kv_bytes_per_token: 1024`)
        begin, low = end, max(pos, end - 200)
        while begin > low and (s[begin - 1].isalnum() or s[begin - 1] in "_.-"):
            begin -= 1
        if not secret_name(s[begin:end].lstrip("-.")):
            continue
        learn(v.group(0))
        out.append(s[pos:m.end()])
        out.append(MASK)
        pos = v.end()
    out.append(s[pos:])
    return "".join(out)


def _userinfo(m: re.Match) -> str:
    info = m.group("info")
    if info != MASK:
        learn(info)
        learn(info.split(":", 1)[-1].replace("\\:", ":").lstrip(":"))
    return f"{m.group('scheme')}{MASK}@"


def _query(m: re.Match) -> str:
    name = m.group("name")
    if not (name.lower() in SECRET_QUERY_KEYS or secret_name(name)) or m.group("value") == MASK:
        return m.group(0)
    learn(m.group("value"))
    return f"{m.group('key')}{MASK}"


def _flag(m: re.Match) -> str:
    if not secret_name(m.group("name")) or m.group("value") == MASK:
        return m.group(0)
    learn(m.group("value"))
    return f"{m.group('key')}{MASK}"


def _bearer(m: re.Match) -> str:
    learn(m.group("value"))
    return f"{m.group('key')}{MASK}"


def redact(text: Any) -> str:
    """`text` with URL credentials, secret query values, bearer tokens, secret header and field values,
    token-shaped values and every secret value seen before as ***."""
    s = text.decode("utf-8", "replace") if isinstance(text, (bytes, bytearray)) else str(text)
    if not s:
        return s
    # each form only where its mark is (a large summary or report is mostly scanned by str.find)
    if "@" in s:
        s = _USERINFO.sub(_userinfo, s)
    if "=" in s:
        s = _QUERY.sub(_query, s)
    if ":" in s or "=" in s:
        s = _fields(s)
    if "--" in s:
        s = _FLAG.sub(_flag, s)
    low = s.lower()
    if "bearer" in low or "basic" in low or "token" in low:
        s = _BEARER.sub(_bearer, s)
    if any(mark in s for mark in _SHAPE_MARKS):
        s = _SHAPES.sub(MASK, s)
    for value in sorted(_LEARNED, key=len, reverse=True) if _LEARNED else ():
        if value in s:
            s = s.replace(value, MASK)
    return s


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
    """A text stream that passes every line through `redact` before the stream it wraps. A line is kept until
    its end ("\n" or "\r") or a flush: `print("token:", value)` writes its pieces apart, and a secret form split
    across writes is still seen whole."""

    def __init__(self, inner):
        self.inner = inner
        self._pending = ""

    def write(self, s: str) -> int:
        """Write the complete lines of what was written so far, redacted; returns len(s), as callers expect."""
        text = self._pending + s
        cut = max(text.rfind("\n"), text.rfind("\r")) + 1
        self._pending = text[cut:]
        if cut:
            self.inner.write(redact(text[:cut]))
        return len(s)

    def flush(self) -> None:
        """Write what is pending (redacted) and flush the wrapped stream."""
        if self._pending:
            pending, self._pending = self._pending, ""
            self.inner.write(redact(pending))
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
    """Route sys.stdout, sys.stderr and every logging handler through `redact` (idempotent), after learning the
    secrets of the command line and of secret-named environment variables."""
    learn_from_environment()
    redact(" ".join(sys.argv[1:]))
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
