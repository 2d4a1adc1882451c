"""Claims: which writer is doing which (sample, repeat) of an arm right now.

A claim is a small file created with O_CREAT|O_EXCL (atomic on local filesystems and on NFSv3+, unlike
flock/O_APPEND there), holding the claiming writer's id. A writer registers itself in `writers/<id>.json`
(host, pid, the pid's start time) and touches that file every `heartbeat_s` from a daemon thread. A claim
is stale, and is taken over, when its writer is gone: on this host, its pid no longer runs (or runs another
program: the start time differs); on another host, its heartbeat is judged by age: its file's mtime against
the shared filesystem's own clock (our heartbeat's mtime), stale after `stale_s`. A heartbeat dated more
than `max_skew_s` in the future (a host with a skewed clock that set the time itself) is not trusted: such
a writer counts as alive only while we see its heartbeat change, judged by our own monotonic clock, so it
is taken over at most `stale_s` after its last beat, never waited on forever.

Takeover of a stale claim is guarded by a marker file `<claim>.takeover-<dead writer>` created with
O_EXCL, so of two writers finding the same stale claim only one takes it. (If a taker dies between the
marker and the takeover, the marker is itself taken over once its writer is gone; two takers can then
both win, which costs repeated work but never a number: the reader counts each (sample, repeat) once.)
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import socket
import threading
import time
from pathlib import Path

from fp8eval.core.errors import Fp8evalError
from fp8eval.core.procs import pid_alive

HOST = socket.gethostname()


class RecordsIOError(Fp8evalError):
    """The records store cannot be written (disk full, read-only, a directory where a file belongs)."""


def io_error(e: OSError, what: str, path: Path) -> RecordsIOError:
    """One line for an OSError of the store, naming the path and what to do."""
    name = errno.errorcode.get(e.errno or 0, "")
    hint = {"ENOSPC": "free some space", "EDQUOT": "free some space", "EROFS": "choose a writable records_dir",
            "EACCES": "choose a records_dir you may write", "EPERM": "choose a records_dir you may write",
            "EISDIR": "move the directory away", "ENOTDIR": "move the file away"}.get(name, "check the path")
    return RecordsIOError(f"cannot {what} {path}: {e.strerror or e} ({name or e.errno}); {hint}, then rerun the "
                          "same command (every record acknowledged so far is kept)")


def _pid_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def claim_name(sample_id: str, repeat: int) -> str:
    """File name of the claim on one (sample, repeat): sample ids may hold any character."""
    return f"{hashlib.sha256(str(sample_id).encode()).hexdigest()[:20]}.{int(repeat)}"


class Claims:
    """The claims directory of one arm, as seen by one writer."""

    def __init__(self, directory: Path, stale_s: float = 600.0, heartbeat_s: float | None = None,
                 max_skew_s: float = 60.0):
        self.dir = Path(directory)
        self.max_skew_s = float(max_skew_s)
        self._seen: dict[str, tuple[float, float]] = {}  # writer -> (heartbeat mtime, our monotonic time then)
        self.writers = self.dir / "writers"
        self.stale_s = float(stale_s)
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else max(1.0, self.stale_s / 4)
        self.writer_id = f"{HOST}-{os.getpid()}-{secrets.token_hex(3)}"
        self.held: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- this writer ------------------------------------------------------------------------------
    def register(self) -> Claims:
        """Announce this writer (and start its heartbeat)."""
        me = {"host": HOST, "pid": os.getpid(), "start": _pid_start(os.getpid())}
        tmp = self.writers / f".{self.writer_id}.tmp"
        try:
            self.writers.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(me), encoding="utf-8")
            os.replace(tmp, self._writer_file(self.writer_id))
        except OSError as e:  # a full disk, a read-only records_dir: one line, not a traceback
            tmp.unlink(missing_ok=True)
            raise io_error(e, "register this writer in", self.writers) from None
        self._thread = threading.Thread(target=self._beat, name="fp8eval-claims-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                os.utime(self._writer_file(self.writer_id))
            except OSError:
                pass

    def close(self) -> None:
        """Release every claim held and unregister."""
        self._stop.set()
        self.release(list(self.held))
        try:
            self._writer_file(self.writer_id).unlink()
        except OSError:
            pass

    def _writer_file(self, writer_id: str) -> Path:
        return self.writers / f"{writer_id}.json"

    # -- liveness ---------------------------------------------------------------------------------
    def writer_alive(self, writer_id: str) -> bool:
        """Whether the writer that made a claim may still be working on it."""
        if writer_id == self.writer_id:
            return True
        path = self._writer_file(writer_id)
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
            mtime = path.stat().st_mtime
        except (OSError, ValueError):
            return False  # never registered completely, or closed: nobody works on its claims
        if info.get("host") == HOST:
            pid = int(info.get("pid", -1))
            return pid_alive(pid) and (info.get("start") is None or _pid_start(pid) in (None, info["start"]))
        try:
            now = self._writer_file(self.writer_id).stat().st_mtime  # the filesystem's clock
        except OSError:
            now = time.time()
        age = now - mtime
        if age >= -self.max_skew_s:
            return age < self.stale_s
        # Dated in the future beyond the skew bound: alive only while its heartbeat keeps changing.
        seen, t = self._seen.get(writer_id), time.monotonic()
        if seen is None or seen[0] != mtime:
            self._seen[writer_id] = (mtime, t)
            return True
        return t - seen[1] < self.stale_s

    def describe(self, writer_id: str) -> str:
        """'host H pid P' of a writer (from its registration, else from its id)."""
        try:
            info = json.loads(self._writer_file(writer_id).read_text(encoding="utf-8"))
            return f"host {info.get('host')} pid {info.get('pid')}"
        except (OSError, ValueError, AttributeError):
            host, _, rest = writer_id.rpartition("-")[0].rpartition("-")
            return f"host {host or '?'} pid {rest or '?'}"

    # -- claims -----------------------------------------------------------------------------------
    def _create(self, path: Path, content: str) -> bool:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        except OSError as e:  # a full disk, a read-only records_dir: one line, not a traceback
            raise io_error(e, "create the claim", path) from None
        try:
            if os.write(fd, content.encode("utf-8")) != len(content.encode("utf-8")):
                raise OSError(errno.ENOSPC, "short write")
        except OSError as e:
            os.close(fd)
            path.unlink(missing_ok=True)  # never an empty claim left behind
            raise io_error(e, "write the claim", path) from None
        os.close(fd)
        return True

    @staticmethod
    def _owner(path: Path) -> str | None:
        try:
            return path.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None

    def try_claim(self, name: str) -> bool:
        """Claim `name` for this writer; False while another live writer holds it."""
        if name in self.held:
            return True
        path = self.dir / name
        for _ in range(3):
            if self._create(path, self.writer_id):
                self.held.add(name)
                return True
            owner = self._owner(path)
            if owner is None:
                # Released between our two calls, or its writer died between create and write: an
                # empty claim older than a second is taken over like a dead writer's.
                try:
                    if path.stat().st_size == 0 and time.time() - path.stat().st_mtime > 1.0:
                        owner = "?"
                    else:
                        continue
                except FileNotFoundError:
                    continue
            if owner == self.writer_id:
                self.held.add(name)
                return True
            if self.writer_alive(owner):
                return False
            if self._take_over(path, owner):
                self.held.add(name)
                return True
            return False
        return False

    def _take_over(self, path: Path, dead: str) -> bool:
        marker = path.with_name(f"{path.name}.takeover-{dead}")
        if not self._create(marker, self.writer_id):
            taker = self._owner(marker)
            if taker is None or self.writer_alive(taker):
                return False
            marker.unlink(missing_ok=True)  # the taker died mid-takeover
            if not self._create(marker, self.writer_id):
                return False
        try:
            if self._owner(path) not in (dead, "?", None):
                return False  # taken over by someone else meanwhile
            tmp = path.with_name(f".{path.name}.{self.writer_id}.tmp")
            tmp.write_text(self.writer_id, encoding="utf-8")
            os.replace(tmp, path)
            return True
        finally:
            marker.unlink(missing_ok=True)

    def release(self, names) -> None:
        """Drop claims (after their records are written, so a done key is never unclaimed and undone)."""
        for name in names:
            if name in self.held:
                self.held.discard(name)
                path = self.dir / name
                if self._owner(path) == self.writer_id:
                    path.unlink(missing_ok=True)

    def live_foreign(self) -> int:
        """Claims now held by other live writers (work that is in progress elsewhere)."""
        n = 0
        for path in self.dir.glob("*.*"):
            if path.name.startswith(".") or ".takeover-" in path.name or path.name in self.held:
                continue
            owner = self._owner(path)
            if owner and owner != self.writer_id and self.writer_alive(owner):
                n += 1
        return n
