"""scripts/install.sh decides where a CPU torch comes from without downloading it (`--which-torch`): a wheel
pip already sees, else FP8EVAL_TORCH_CPU_INDEX, else PyTorch's public CPU wheel index."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from conftest import REPO

PUBLIC_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _which(tmp_path, find_links, index=None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "FP8EVAL_TORCH_CPU_INDEX"}
    env.update(PYTHON=sys.executable, PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS=str(find_links),
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    if index is not None:
        env["FP8EVAL_TORCH_CPU_INDEX"] = index
    out = subprocess.run(["bash", str(REPO / "scripts" / "install.sh"), "--which-torch"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip()


def _fake_torch_wheel(directory) -> None:
    """A minimal valid wheel named torch 2.13.0+cpu: enough for pip to resolve it, nothing to install."""
    directory.mkdir()
    info = "torch-2.13.0+cpu.dist-info"
    with zipfile.ZipFile(directory / "torch-2.13.0+cpu-py3-none-any.whl", "w") as z:
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


def test_no_wheel_and_no_variable_falls_back_to_pytorchs_public_cpu_index(tmp_path):
    (tmp_path / "empty").mkdir()
    line = _which(tmp_path, tmp_path / "empty")
    assert line.startswith(f"index {PUBLIC_CPU_INDEX} "), line
    assert "FP8EVAL_TORCH_CPU_INDEX" in line  # it says how to choose another


def test_the_variable_overrides_the_public_index(tmp_path):
    (tmp_path / "empty").mkdir()
    line = _which(tmp_path, tmp_path / "empty", index="http://mirror.example/whl/cpu")
    assert line == "index http://mirror.example/whl/cpu (FP8EVAL_TORCH_CPU_INDEX)", line


def test_a_wheel_at_hand_wins_over_any_index(tmp_path):
    _fake_torch_wheel(tmp_path / "wheels")
    line = _which(tmp_path, tmp_path / "wheels", index="http://mirror.example/whl/cpu")
    assert line.startswith("local (a torch==2.13.0 wheel pip already sees"), line  # says what "local" means
