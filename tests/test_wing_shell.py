"""One shell for every Hydra wing (fp8eval/wing.py): each wing's `main` is made by `hydra_wing`, each wing's YAML
registers the redacting callback, and the shell's exit codes: 2 with one line for an error, the body's own
status, 130 for Ctrl-C and 143 for SIGTERM."""

from __future__ import annotations

import ast
import importlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from fp8eval.core.errors import Fp8evalError
from fp8eval.core.signals import Terminated
from fp8eval.wing import hydra_wing

# every Hydra wing: its module and its YAML in conf/
WINGS = {"fp8eval": "config", "fp8eval.divergence": "divergence", "fp8eval.sensitivity": "sensitivity",
         "fp8eval.pareto": "pareto", "fp8eval.power": "power", "fp8eval.calibrate": "calibrate",
         "fp8eval.perf": "perf"}
CALLBACK = "fp8eval.hydra_callbacks.RedactHydraFiles"


def test_every_hydra_wing_runs_through_the_one_shell_and_redacts_hydras_files():
    apps = {p.stem for p in (REPO / "conf").glob("*.yaml")
            if "hydra" in (yaml.safe_load(p.read_text()) or {})}
    assert apps == set(WINGS.values()), "a new Hydra wing: add it to WINGS and make its main with hydra_wing"
    for module, config in WINGS.items():
        main = importlib.import_module(f"{module}.__main__").main
        assert main.__doc__ == f"`python -m {module}` (fp8eval.wing.hydra_wing over conf/{config}.yaml).", module
        hydra = yaml.safe_load((REPO / "conf" / f"{config}.yaml").read_text())["hydra"]
        assert hydra["callbacks"]["redact_secrets"]["_target_"] == CALLBACK, config
    # and no module builds a Hydra app of its own
    for path in sorted((REPO / "fp8eval").rglob("*.py")):
        if path.name == "wing.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "main" and isinstance(node.value, ast.Name):
                assert node.value.id != "hydra", f"{path}: use fp8eval.wing.hydra_wing"


def _no_secret(root: Path, *texts: str) -> list[Path]:
    files = [p for p in root.rglob("*") if p.is_file()]
    for text in (*texts, *(p.read_text(errors="replace") for p in files)):
        assert "hunter2" not in text and "KEYSECRET" not in text
    return files


@pytest.mark.parametrize("wing,args,code", [
    ("fp8eval.power", ["power.delta=3"], 0),
    ("fp8eval.pareto", ["pareto.survivors=0"], 2),  # refused at once (one line), after Hydra saved its files
])
def test_pareto_and_power_redact_what_they_print_and_write(tmp_path, wing, args, code):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", wing, "engine=server", "engine.base_url=http://alice:hunter2@127.0.0.1:9",
                           "++engine.default_headers.X-Api-Key=KEYSECRET", *args, "hydra.run.dir=run"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    files = _no_secret(tmp_path / "run", proc.stdout, proc.stderr)
    assert {"config.yaml", "hydra.yaml", "overrides.yaml"} <= {p.name for p in files}
    assert "http://***@127.0.0.1:9" in (tmp_path / "run" / ".hydra" / "config.yaml").read_text()


@pytest.fixture
def shell(tmp_path, monkeypatch):
    """Runs a hydra_wing over conf/power.yaml in this process; restores the streams and SIGTERM after."""
    from hydra.core.global_hydra import GlobalHydra

    import fp8eval.power.__main__  # noqa: F401 - registers power_schema

    monkeypatch.setattr(sys, "stdout", sys.stdout)
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    monkeypatch.chdir(tmp_path)
    before = signal.getsignal(signal.SIGTERM)

    def run(body, **kw) -> int:
        GlobalHydra.instance().clear()
        monkeypatch.setattr(sys, "argv", ["wing", "hydra.run.dir=run"])
        with pytest.raises(SystemExit) as exit_:
            hydra_wing("fp8eval.test", "power", body, **kw)()
            raise SystemExit(0)
        return int(exit_.value.code or 0)

    yield run
    signal.signal(signal.SIGTERM, before)
    GlobalHydra.instance().clear()


def test_the_shell_gives_every_wing_the_same_exit_codes(shell, capsys):
    seen = {}

    def ok(cfg, run_dir):
        seen.update(cfg=cfg, run_dir=run_dir)
        print("serving http://alice:hunter2@h:1")

    assert shell(ok) == 0
    assert type(seen["cfg"]).__name__ == "PowerRunConfig" and seen["run_dir"].name == "run"
    assert "hunter2" not in capsys.readouterr().out  # the streams are redacted

    def fails(cfg, run_dir):
        raise Fp8evalError("no such thing")

    assert shell(fails) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["fp8eval.test: no such thing"]
    assert shell(lambda cfg, run_dir: 3) == 3
    assert shell(lambda cfg, run_dir: (_ for _ in ()).throw(ValueError("bad")), errors=(ValueError,)) == 2

    def interrupted(cfg, run_dir):
        raise KeyboardInterrupt

    def terminated(cfg, run_dir):
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # SIGTERM raises Terminated now
        raise Terminated

    assert shell(interrupted) == 130
    assert "fp8eval.test: interrupted" in capsys.readouterr().err
    assert shell(terminated) == 143

    def argv_check(argv):
        raise Fp8evalError(f"refused {argv[-1]}")

    assert shell(ok, argv=argv_check) == 2
    assert "fp8eval.test: refused hydra.run.dir=run" in capsys.readouterr().err


@pytest.mark.parametrize("wing", ["divergence", "power"])
def test_a_wings_help_explains_its_keys_not_hydras(wing):
    """`python -m fp8eval.<wing> --help` prints what `fp8eval <wing> --help` prints (keys from the sources); Hydra's
    own help stays behind --hydra-help."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    got = subprocess.run([sys.executable, "-m", f"fp8eval.{wing}", "--help"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert got.returncode == 0 and got.stdout.startswith(f"usage: fp8eval {wing} "), got.stdout[:300] + got.stderr
    hydra = subprocess.run([sys.executable, "-m", f"fp8eval.{wing}", "--hydra-help"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert "Hydra" in hydra.stdout
