"""The wheel's build step (metadata lives in pyproject.toml): the checkout's conf/ and tasks/ become package data
under fp8eval/_data/, with the commit the wheel was built from (fp8eval/_data/build.json), so an installed
fp8eval composes its configs and reads its task files from any directory. Nothing in the repository moves; an
editable install (scripts/install.sh) reads conf/ and tasks/ in place (fp8eval/core/paths.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
DATA_DIRS = ("conf", "tasks")
COMMIT_FILE = "BUILD_COMMIT"  # what an sdist records, for a wheel built from it without git


def source_commit() -> str | None:
    """The checkout's commit (`-dirty` when tracked files changed), else the one an sdist recorded, else None."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        if out:
            return out
    except (OSError, subprocess.SubprocessError):
        pass
    recorded = ROOT / COMMIT_FILE
    return recorded.read_text(encoding="utf-8").strip() or None if recorded.is_file() else None


class BuildPyWithData(build_py):
    """build_py, then conf/ and tasks/ copied into the build's fp8eval/_data/ (not for an editable install)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "fp8eval" / "_data"
        for name in DATA_DIRS:
            shutil.rmtree(target / name, ignore_errors=True)
            shutil.copytree(ROOT / name, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (target / "build.json").write_text(json.dumps({"commit": source_commit()}) + "\n", encoding="utf-8")


class SdistWithCommit(sdist):
    """sdist that records the commit it was made from (a wheel built from it has no git)."""

    def make_release_tree(self, base_dir, files) -> None:
        super().make_release_tree(base_dir, files)
        commit = source_commit()
        if commit:
            (Path(base_dir) / COMMIT_FILE).write_text(commit + "\n", encoding="utf-8")


setup(cmdclass={"build_py": BuildPyWithData, "sdist": SdistWithCommit})
