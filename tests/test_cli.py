"""The `fp8eval` command: subcommands over the existing tools, --help that explains keys without importing the
heavy libraries, one-line answers to typos and type errors, --version, replay of a saved run, the combined report
at the end of a sweep, and your own model from its directory (model=hf)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, compose, last_path, run_cli, summary_of

FAST = ["engine=fake", "anatomy=false", "task.lengths=[512]", "task.depths=[0,100]"]


def _fp8eval(args, cwd, check=True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", "import sys; from fp8eval.cli import main; sys.exit(main())", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    proc.cwd = cwd
    return proc


def test_help_explains_keys_without_importing_torch_hydra_or_transformers():
    code = ("import sys, io, contextlib; from fp8eval.cli import main\n"
            "for args in (['--help'], ['--help', 'stats'], ['perf', '--help'], ['perf', '--help', 'perf'], ['--help', 'task=mrcr']):\n"
            "    buf = io.StringIO()\n"
            "    with contextlib.redirect_stdout(buf): assert main(args) == 0\n"
            "    print(buf.getvalue())\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'hydra', 'pandas'))\n"
            "assert not heavy, heavy\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "stats.gate  (float, default 95.0)" in text and "recovery % the variant must keep" in text
    assert "replay" in text and "knobaudit" in text  # the subcommands
    assert "schema/" not in text  # no internal groups
    assert "[smollm2-135m]" in text and "model=hf model.hf_id=ORG/NAME" in text
    assert "perf.client" in text and "task.o200k_prefilter" in text


def test_python_m_fp8eval_help_is_the_same_help(tmp_path):
    out = subprocess.run([sys.executable, "-m", "fp8eval", "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "keys of `run`" in out.stdout and "Hydra flags" in out.stdout


@pytest.mark.parametrize("args, expect", [
    (["modle=x"], "unknown key 'modle' (did you mean model?)"),
    (["task.lengths=512"], "task.lengths takes list[int], not '512': write a list, e.g. task.lengths=[512]"),
    (["stats.gate=high"], "stats.gate takes float, not 'high'"),
    (["kv=fp9"], "no kv option 'fp9' (did you mean fp8?)"),
    (["task.lenghts=[1]"], "task has no 'lenghts' (did you mean lengths?)"),
    (["model=hf"], "model=hf needs your model: model.hf_id=ORG/NAME"),
    (["repot", "x"], "unknown subcommand 'repot' (did you mean report?)"),
    (["perf", "perf.lenghts=[1]"], "perf has no 'lenghts' (did you mean lengths?)"),
    (["power", "powr.delta=3"], "unknown key 'powr.delta' (did you mean power?)"),
])
def test_a_typo_or_type_error_is_one_line_with_the_fix(tmp_path, args, expect):
    proc = _fp8eval(args, tmp_path, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0], proc.stderr


def test_version_names_fp8eval_and_the_commit(tmp_path):
    out = _fp8eval(["--version"], tmp_path).stdout.strip()
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert out.startswith("fp8eval 0.") and f"(commit {head}" in out, out


def test_argparse_tools_take_key_value(tmp_path):
    run = last_path(run_cli(tmp_path, [*FAST, "report=false"]))
    flags = _fp8eval(["report", str(run), "--gate", "80", "--out", str(tmp_path / "a")], tmp_path)
    keys = _fp8eval(["report", str(run), "stats.gate=80", f"out={tmp_path / 'b'}", "no_cache=true"], tmp_path)
    gate = [json.loads((tmp_path / d / "verdicts.json").read_text())["headline"][0] for d in ("a", "b")]
    assert gate[0] == gate[1] and flags.stdout.splitlines()[0] == keys.stdout.splitlines()[0]
    assert "Gate 80%" in (tmp_path / "b" / "report.md").read_text()


@pytest.mark.slow  # three fake-engine runs: ~45 s on a loaded 2-core box
def test_replay_reruns_a_saved_run_exactly_or_refuses_in_one_line(tmp_path):
    original = run_cli(tmp_path, [*FAST, "kv=fp8_e5m2", "seed=7"])
    run = last_path(original)
    s0 = summary_of(original)
    fresh = _fp8eval(["replay", str(run), f"records_dir={tmp_path / 'fresh'}", "progress=false"], tmp_path)
    s1 = json.loads((last_path(fresh) / "summary.json").read_text())
    assert last_path(fresh) != run and s1["arms"]["fp8_e5m2"]["requests_sent"] > 0  # generated again
    for name in ("bf16", "fp8_e5m2"):
        assert s1["arms"][name]["fingerprint"] == s0["arms"][name]["fingerprint"]
    assert s1["recovery"] == s0["recovery"]
    again = _fp8eval(["replay", str(run), "progress=false"], tmp_path / "records")  # from another directory
    s2 = json.loads((last_path(again) / "summary.json").read_text())
    assert s2["recovery"] == s0["recovery"] and s2["arms"]["bf16"]["requests_sent"] == 0  # the run's own records

    masked = tmp_path / "masked"  # a run whose saved files hold a masked secret (unquoted: a YAML alias)
    (masked / ".hydra").mkdir(parents=True)
    for name in ("hydra.yaml", "config.yaml"):
        (masked / ".hydra" / name).write_text((run / ".hydra" / name).read_text() + "api_key: ***\n")
    broken = tmp_path / "broken"
    (broken / ".hydra").mkdir(parents=True)
    (broken / ".hydra" / "config.yaml").write_text("a: [1,\n")
    for args, expect in ((["replay", str(run), "seed=3"], "a replay changes only"),
                         (["replay", str(masked)], "has secrets masked as ***"),
                         (["replay", str(broken)], "config.yaml does not parse"),
                         (["replay", str(tmp_path)], ".hydra/config.yaml not found"),
                         (["--config-dir", str(run / ".hydra"), "--config-name", "config"], "fp8eval replay"),
                         (["--config-path", str(run / ".hydra"), "--config-name", "config"], "fp8eval replay")):
        proc = _fp8eval(args, tmp_path, check=False)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert expect in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # a three-process sweep: ~30 s on a loaded 2-core box
def test_a_sweep_ends_with_one_combined_report(tmp_path):
    proc = run_cli(tmp_path, ["-m", "kv=fp8,fp8_e5m2", *FAST, "hydra.sweep.dir=sweep"])
    assert "combined report of the sweep: sweep/report" in proc.stdout
    verdicts = json.loads((tmp_path / "sweep" / "report" / "verdicts.json").read_text())
    assert sorted(r["variant"] for r in verdicts["headline"] if r["group"] == "all") == ["fp8", "fp8_e5m2"]


def _own_model(tmp_path) -> Path:
    """A model directory of our own: SmolLM2's tokenizer (the fake engine loads no weights), a config.json with a
    3000-token context and a generation_config.json that samples."""
    from fp8eval.models import local_model_dir

    source = Path(local_model_dir(compose([]).model))
    own = tmp_path / "My-Model"
    own.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / name).is_file():
            shutil.copy(source / name, own / name)
    config = json.loads((source / "config.json").read_text())
    (own / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 3000}))
    (own / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.6, "top_p": 0.9}))
    return own


def test_your_own_model_in_one_line_reads_context_and_sampling_from_its_files(tmp_path):
    own = _own_model(tmp_path)
    cfg = compose(["model=hf", f"model.hf_id={own}"])
    assert (cfg.model.name, cfg.model.max_model_len, cfg.model.chat_template) == ("my-model", 3000, True)
    assert (cfg.model.sampling.temperature, cfg.model.sampling.top_p, cfg.model.sampling.top_k) == (0.6, 0.9, None)
    (own / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    assert compose(["model=hf", f"model.hf_id={own}", "model.max_model_len=2048"]).model.sampling.temperature == 0.0


@pytest.mark.slow  # a fake-engine run: ~20 s on a loaded 2-core box
def test_your_own_model_runs_within_its_context(tmp_path):
    own = _own_model(tmp_path)
    proc = run_cli(tmp_path, ["model=hf", f"model.hf_id={own}", "engine=fake", "anatomy=false",
                              "task.lengths=[512,4096]", "task.depths=[50]"])
    s = summary_of(proc)
    assert s["model"] == "my-model"
    # the 4096-token cell is built within the 3000 tokens config.json gives (the task fits it to the context)
    assert s["arms"]["fp8"]["n_scored"] == 2 and s["arms"]["fp8"]["mean_prompt_tokens"] < (512 + 3000) / 2 + 10


def test_mrcr_offline_without_its_files_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    proc = _fp8eval(["task=mrcr", "engine=fake", "progress=false", f"records_dir={tmp_path / 'r'}"], tmp_path,
                    check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "HF_HUB_OFFLINE=1" in lines[0] and "task.synthetic=true" in lines[0] and "task.data_files" in lines[0]
