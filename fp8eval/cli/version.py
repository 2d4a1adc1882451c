"""fp8eval's commit: from git in a checkout, else the one an installed wheel recorded when it was built
(fp8eval/_data/build.json, written by setup.py), else "unknown"."""

from __future__ import annotations

import json
import subprocess

from fp8eval.core.paths import DATA_ROOT, PROJECT_ROOT


def commit() -> str:
    """The commit this fp8eval comes from (`-dirty` when a checkout's tracked files changed)."""
    if DATA_ROOT == PROJECT_ROOT and (PROJECT_ROOT / ".git").exists():
        try:
            out = subprocess.run(["git", "-C", str(PROJECT_ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
                                 capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        recorded = json.loads((DATA_ROOT / "build.json").read_text(encoding="utf-8")).get("commit")
    except (OSError, ValueError, AttributeError):
        recorded = None
    return recorded or "unknown"
