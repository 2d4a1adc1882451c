"""A wheel built from the checkout, installed into a fresh virtual environment outside it, is a working fp8eval:
`fp8eval engine=fake` from another directory composes the shipped configs, reads the shipped task files and writes
its report; `fp8eval --version` names fp8eval and the commit the wheel was built from. Offline: the wheel is built
without build isolation and installed without dependencies; the new environment sees this environment's
dependencies through a .pth file (not this checkout: the installed fp8eval is the one that runs)."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import zipfile

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow  # a wheel build, a venv and a fake-engine run: ~40 s on 2 cores


def _run(args, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, **kw)
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_a_wheel_installed_outside_the_checkout_runs_from_another_directory(tmp_path):
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(REPO)])
    (wheel,) = wheels.glob("fp8eval-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "fp8eval/_data/conf/config.yaml" in names and "fp8eval/_data/tasks/niah/prompt.txt" in names
    assert any(n.startswith("fp8eval/_data/conf/model/") for n in names)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    purelib = next(venv.glob("lib/python*/site-packages"))
    # this environment's dependencies, without its editable fp8eval (a .pth inside an added path is not run)
    (purelib / "_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
          "--no-index", str(wheel)])

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = _run([str(venv / "bin" / "python"), "-c", "import fp8eval.core.paths as p; print(p.CONF_DIR)"],
                 cwd=elsewhere, env=env).stdout.strip()
    assert where.startswith(str(purelib)), where  # the installed package's configs, not the checkout's

    version = _run([str(venv / "bin" / "fp8eval"), "--version"], cwd=elsewhere, env=env).stdout
    assert version.startswith("fp8eval 0.") and "commit unknown" not in version, version

    helped = _run([str(venv / "bin" / "python"), "-m", "fp8eval", "--help"], cwd=elsewhere, env=env).stdout
    assert "stats.*" in helped and "subcommands:" in helped

    proc = _run([str(venv / "bin" / "fp8eval"), "engine=fake", "progress=false", "anatomy=false",
                 "task.lengths=[512]", f"records_dir={tmp_path / 'records'}"], cwd=elsewhere, env=env)
    run_dir = elsewhere / proc.stdout.strip().splitlines()[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["task"] == "niah" and summary["recovery"] is not None
    assert (run_dir / "report" / "index.html").is_file() and (run_dir / "report" / "report.md").is_file()
    assert not (REPO / "fp8eval" / "_data").exists()  # the build step copies into the build, never the checkout
