"""A report is a pure function of its inputs, so a rerun that changed nothing copies the last one.

Rendering costs ~3.5 s on a 2-core CPU (pandas, matplotlib and seaborn imports, the bootstrap, the
figures), which is most of a zero-work rerun. The key is everything the report reads: each run's
`.hydra/config.yaml`, its summary.json without what only describes that invocation (wall time,
requests sent, the engine's prefill counters), each records file's sha256 (milliseconds: records
hold completions, not prompts), the settings, the versions of the plotting libraries and a hash of the
report's own source. The run directories' paths are not in the key: a hit copies the files and
rewrites the old paths (listed under "Inputs") to the new ones.

Entries live in `$FP8EVAL_CACHE/reports/` (default ~/.cache/fp8eval); the newest 32 are kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from importlib import metadata
from pathlib import Path

from fp8eval.core.filehash import stream_sha256
from fp8eval.core.paths import cache_root
from fp8eval.records.anatomy import store_path
from fp8eval.records.reader import arm_files
from fp8eval.report.load import ReportInputError, _resolve_records_path

OUTPUTS = ("recovery.csv", "flips.csv", "arms.csv", "report.md", "index.html", "verdicts.json", "worth.json",
           "noise_floor.csv", "figures")
TEXT_SUFFIXES = (".md", ".html", ".json", ".csv")
KEEP = 32
_VOLATILE_RUN = ("wall_s", "anatomy", "timing")  # anatomy: this invocation's counts (its rows are keyed below); timing
_VOLATILE_ARM = ("requests_sent", "engine_prefill", "records_io")
_SOURCES = ("report/*.py", "metrics/*.py")


def _root() -> Path:
    return cache_root() / "reports"


def _code_hash() -> str:
    pkg = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for pattern in _SOURCES:
        for path in sorted(pkg.glob(pattern)):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None




def report_key(run_dirs: list[Path], settings: dict) -> str | None:
    """The inputs' digest, or None when an input is missing or odd (the builder then says why)."""

    runs = []
    try:
        for run_dir in run_dirs:
            summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
            config = (run_dir / ".hydra" / "config.yaml").read_text(encoding="utf-8")
            for key in _VOLATILE_RUN:
                summary.pop(key, None)
            files = []
            for arm in (summary.get("arms") or {}).values():
                for key in _VOLATILE_ARM:
                    arm.pop(key, None)
                path = _resolve_records_path(str(arm["records"]), run_dir, {})
                for i, part in enumerate(arm_files(path)):  # the primary file, then concurrent writers' segments
                    files.append([str(arm["records"]) if i == 0 else part.name,
                                  stream_sha256(part)])
                dissected = store_path(path.parents[1], str(summary.get("task")), str(arm.get("fingerprint", "")))
                if dissected.is_file():  # the anatomy of the arm's flips (fp8eval.anatomy), joined to flips.csv
                    files.append([dissected.name, stream_sha256(dissected)])
            runs.append({"config": config, "summary": summary, "records": files})
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ReportInputError):
        return None
    material = {"runs": runs, "settings": settings, "code": _code_hash(),
                "versions": {p: _version(p) for p in ("pandas", "numpy", "matplotlib", "seaborn")}}
    blob = json.dumps(material, sort_keys=True, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:24]


def _rewrite(out: Path, pairs: list[tuple[str, str]]) -> None:
    import html

    pairs = [p for p in pairs if p[0] != p[1]]
    pairs += [(html.escape(a), html.escape(b)) for a, b in pairs if html.escape(a) != a]
    if not pairs:
        return
    pairs.sort(key=lambda p: -len(p[0]))  # a path before any shorter path it starts with
    for path in out.rglob("*"):
        if path.suffix in TEXT_SUFFIXES and path.is_file():
            text = path.read_text(encoding="utf-8")
            new = text
            for old, fresh in pairs:
                new = new.replace(old, fresh)
            if new != text:
                path.write_text(new, encoding="utf-8")


def _copy_outputs(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for name in OUTPUTS:
        s, d = src / name, dst / name
        if s.is_dir():
            shutil.copytree(s, d, dirs_exist_ok=True)
        elif s.is_file():
            shutil.copy2(s, d)


def restore(key: str, run_dirs: list[Path], out: Path) -> bool:
    """Copy the cached report of `key` into `out`, rewriting its old paths to these run dirs and `out`; False when there
    is no usable entry."""
    entry = _root() / key
    try:
        meta = json.loads((entry / "_inputs.json").read_text(encoding="utf-8"))
        if len(meta["run_dirs"]) != len(run_dirs):
            return False
        _copy_outputs(entry, out)
    except (OSError, ValueError, KeyError):
        return False
    pairs = [(str(a), str(b)) for a, b in zip(meta["run_dirs"], run_dirs)] + [(meta["out"], str(out))]
    _rewrite(out, pairs)
    os.utime(entry)  # recently used: kept by the pruning
    return True


def store(key: str, run_dirs: list[Path], out: Path) -> None:
    """Keep a copy of the report in `out` under `key` (with the paths to rewrite on restore) and prune old entries; a
    write failure is ignored."""
    root = _root()
    tmp = root / f".{key}.{os.getpid()}.tmp"
    try:
        _copy_outputs(out, tmp)
        (tmp / "_inputs.json").write_text(json.dumps({"run_dirs": [str(d) for d in run_dirs],
                                                      "out": str(out)}) + "\n", encoding="utf-8")
        if (root / key).exists():
            shutil.rmtree(root / key, ignore_errors=True)
        os.replace(tmp, root / key)
        _prune(root)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # a cache that cannot be written only costs time


def _prune(root: Path) -> None:
    entries = sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".*.tmp"):  # left by a killed process more than an hour ago
        if time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)
