"""Red team, round three (issue 37): every input checked before work by one pass shared by every wing, every
secret form redacted (forms generated, not listed), records that survive any completion or line, CSV cells
that never run as formulas, and user texts read only as far as they are used."""

from __future__ import annotations

import importlib
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_inprocess

from fp8eval.core import secrets
from fp8eval.validate import InputError, validate_config, validate_report_options

WINGS = {"config": "fp8eval.registry", "divergence": "fp8eval.divergence.__main__",
         "pareto": "fp8eval.pareto.__main__", "power": "fp8eval.power.__main__",
         "sensitivity": "fp8eval.sensitivity.__main__", "perf": "fp8eval.perf.__main__",
         "calibrate": "fp8eval.calibrate.__main__"}


def wing_cfg(wing: str, *overrides: str):
    """The typed config `python -m fp8eval[.wing] <overrides>` composes."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    mod = importlib.import_module(WINGS[wing])
    getattr(mod, "register", getattr(mod, "register_configs", None))()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name=wing, overrides=list(overrides)))


def cli(tmp_path: Path, module: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=timeout)


# --- one validation pass, every wing ------------------------------------------------------------------------
BAD_VALUES = [  # (wings, override, what the one line says)
    (("config", "power"), "stats.right_at=0", "stats.right_at=0.0: must be a finite number > 0 and <= 1"),
    (("config", "power"), "stats.right_at=2", "stats.right_at=2.0: must be a finite number > 0 and <= 1"),
    (("config", "power"), "stats.alpha=nan", "stats.alpha=nan"),
    (("config",), "stats.gate=-5", "stats.gate=-5.0: must be a finite number > 0 and <= 100"),
    (("config",), "stats.power=1", "stats.power=1.0"),
    (("config",), "stop.round_size=0", "stop.round_size=0: must be an integer >= 1"),
    (("config",), "stop.cap=nan", "stop.cap=nan"),
    (("config",), "stop.alpha_cs=0.2", "stop.alpha_cs=0.2: must be below stats.alpha=0.05"),
    (("power",), "power.alpha=1.5", "power.alpha=1.5"),
    (("power",), "power.delta=-3", "power.delta=-3.0"),
    (("power",), "power.recovery_floor=100", "power.recovery_floor=100.0"),
    (("power",), "power.samples=0", "power.samples=0"),
    (("pareto",), "pareto.max_kl=nan", "pareto.max_kl=nan"),
    (("pareto", "divergence"), "divergence.lengths=[-5]", "divergence.lengths=[-5]: each must be an integer >= 2"),
    (("pareto", "divergence"), "divergence.lengths=[0]", "divergence.lengths=[0]"),
    (("pareto", "divergence"), "model.max_model_len=300",
     "divergence.lengths=[1024]: every length is above 299 tokens (model.max_model_len=300 - 1)"),
    (("sensitivity",), "sensitivity.target=0", "sensitivity.target=0.0"),
    (("sensitivity",), "sensitivity.lengths=[-1]", "sensitivity.lengths=[-1]"),
    (("calibrate",), "calib.samples=0", "calib.samples=0"),
    (("perf",), "perf.sweep_requests=0", "perf.sweep_requests=0"),
]


@pytest.mark.parametrize("wings, override, message", BAD_VALUES, ids=[b[1] for b in BAD_VALUES])
def test_one_pass_refuses_each_bad_value_in_every_wing(wings, override, message):
    extra = ("divergence.lengths=[1024]",) if "max_model_len" in override else ()
    for wing in wings:
        cfg = wing_cfg(wing, override, *extra)
        with pytest.raises(InputError) as e:
            validate_config(cfg)
        assert message in str(e.value) and "\n" not in str(e.value), (wing, str(e.value))


@pytest.mark.parametrize("wing", sorted(WINGS))
def test_every_shipped_wing_config_passes_the_pass(wing):
    validate_config(wing_cfg(wing))


def test_every_wing_entry_point_calls_the_one_pass():
    """A wing that skips the pass is how `pareto divergence.lengths=[-5]` ran for 240 s: each entry point calls
    validate_config (the main CLI, divergence, pareto, power, sensitivity, perf, calibrate)."""
    for path in ("wing.py", "divergence/run.py", "pareto/sweep.py", "perf/run.py", "up.py", "knobaudit/__main__.py"):
        assert "validate_config(" in (REPO / "fp8eval" / path).read_text(), path
    for wing in ("__main__.py", "divergence/__main__.py", "pareto/__main__.py", "power/__main__.py",
                 "sensitivity/__main__.py", "perf/__main__.py", "calibrate/__main__.py"):
        assert "hydra_wing(" in (REPO / "fp8eval" / wing).read_text(), wing  # the shell that runs the pass
    assert "validate_report_options(" in (REPO / "fp8eval" / "report" / "__main__.py").read_text()


@pytest.mark.parametrize("options, message", [
    ({"--gate": float("nan")}, "--gate=nan"), ({"--gate": 0.0}, "--gate=0.0"), ({"--level": 1.0}, "--level=1.0"),
    ({"--level": 0.0}, "--level=0.0"), ({"--right-at": 2.0}, "--right-at=2.0"), ({"--n-boot": 0}, "--n-boot=0"),
    ({"--sign-alpha": -0.1}, "--sign-alpha=-0.1"), ({"--z": float("inf")}, "--z=inf"),
])
def test_report_options_are_range_checked(options, message):
    good = {"--gate": 95.0, "--level": 0.95, "--unsure-margin": 0.0, "--sign-alpha": 0.05, "--right-at": 0.5,
            "--z": 1.96, "--n-boot": 2000}
    validate_report_options(good)
    with pytest.raises(InputError, match=message.replace(".", r"\.").replace("-", r"\-")):
        validate_report_options({**good, **options})


def test_report_cli_refuses_a_nan_gate_before_reading_anything(tmp_path):
    proc = cli(tmp_path, "fp8eval.report", str(tmp_path / "nowhere"), "--gate", "nan")
    assert proc.returncode == 2 and "--gate=nan" in proc.stderr and "Traceback" not in proc.stderr


def test_main_cli_refuses_right_at_zero_before_any_request(tmp_path):
    from conftest import run_cli

    proc = run_cli(tmp_path, ["engine=fake", "task.lengths=[1024]", "task.depths=[0]", "stats.right_at=0"],
                   check=False)
    assert proc.returncode == 2 and "stats.right_at=0.0" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "records").exists()


def test_pareto_refuses_negative_lengths_at_once(tmp_path):
    proc = cli(tmp_path, "fp8eval.pareto", "divergence.lengths=[-5]", "hydra.run.dir=run", timeout=120)
    assert proc.returncode == 2 and "divergence.lengths=[-5]: each must be an integer >= 2" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run" / "points").exists()


# --- redaction: forms generated, values learned ---------------------------------------------------------------
PASSWORDS = ["Pw{0}q", "p'w{0}", "p@w@{0}", "p:w{0}", "p%40w{0}", "p!$&w{0}", "p~+w{0}", "p=w{0}", "p\"w{0}"]
QUERY_NAMES = ["hf_token", "api_key", "apiKey", "access_token", "X-Amz-Signature", "sig", "token", "password",
               "client_secret", "auth", "key", "Private-Token", "sas_key"]
HEADER_NAMES = ["X-Access-Token", "Authorization", "X-Api-Key", "Api-Key", "Private-Token", "Cookie", "hf_token",
                "x-goog-api-key", "Ocp-Apim-Subscription-Key", "openai_api_key", "X-Auth-Token", "refreshToken"]


def _url_forms(pw: str):
    yield f"http://alice:{pw}@h.example:8000/v1"
    yield f"https://{pw}@h.example/v1"
    yield f"http://alice:{pw}@10.0.0.1"


def _carriers(name: str, value: str):
    """Every spelling a value of `name` takes in our files and streams."""
    from omegaconf import OmegaConf

    yield f"+engine.default_headers.{name}={value}"
    yield f"--{name}={value}"
    yield f"{name}: {value}"
    yield json.dumps({name: value})
    yield json.dumps({name: value}, indent=2)
    yield repr({name: value})
    yield OmegaConf.to_yaml({"engine": {"default_headers": {name: value}}})
    yield f"{name}=Bearer {value}"
    flag = "--" + name.lower().replace("_", "-")
    yield f"vllm serve m {flag} {value} --port 8000"
    yield repr([flag, value, "--port"])


def _spellings(text: str):
    """The text as written raw, Hydra-escaped (overrides.yaml), JSON-escaped, YAML-dumped."""
    import yaml

    yield text
    yield text.replace(":", "\\:")
    yield json.dumps(text)
    yield yaml.safe_dump({"override": text})


def _fresh():
    secrets._LEARNED.clear()


def _core(pw: str) -> str:
    """The part of a password that must never appear (all of it, as written)."""
    return pw


def test_every_generated_secret_form_is_redacted():
    n = 0
    for i, pw_form in enumerate(PASSWORDS):
        pw = pw_form.format(f"SECRET{i}")
        for url in _url_forms(pw):
            for q in QUERY_NAMES:
                for text in _spellings(f"base_url={url}?x=1&{q}=QSECRET{i}x&y=2"):
                    _fresh()
                    out = secrets.redact(text)
                    assert f"SECRET{i}" not in out and f"QSECRET{i}x" not in out, (text, out)
                    assert "h.example" in out or "10.0.0.1" in out, (text, out)  # the host stays
                    assert secrets.redact(out) == out
                    n += 1
    for (i, name), value in itertools.product(enumerate(HEADER_NAMES), ["HDRSECRET{}v", "sk-HDRSECRET{}v"]):
        value = value.format(i)
        for carrier in _carriers(name, value):
            for text in _spellings(carrier):
                _fresh()
                out = secrets.redact(text)
                assert "HDRSECRET" not in out, (text, out)
                n += 1
    assert n > 2000


def test_benign_forms_are_left_alone():
    """No field whose name only resembles a secret's: counts of tokens, keys of points, the env var's name."""
    benign = ["max_tokens: 128", "kv_bytes_per_token: 1024", "key: fp8/none/uncalibrated", "tokenizer: gpt2",
              "api_key_env: OPENAI_API_KEY", '"prefill_tokens_per_arm": 4096.0', "monkey=1", "token_budget: 3",
              "http://127.0.0.1:8000/v1 and me@example.com", "sort_key: x", '{"n_tokens": 95, "key": "a"}']
    for text, spelling in itertools.product(benign, range(3)):
        _fresh()
        t = list(_spellings(text))[spelling]
        assert secrets.redact(t) == t


def test_a_value_seen_once_is_masked_in_any_later_spelling():
    _fresh()
    secrets.redact("engine.base_url=http://alice:s3cr'et@h/v1")
    for later in ["s3cr'et", "s3cr%27et", "s3cr''et", "password is s3cr'et"]:
        assert "s3cr" not in secrets.redact(later), later
    secrets.learn_from_environment({"HF_TOKEN": "hfvalue123", "PATH": "/usr/bin", "PWD": "projdir42",
                                    "OLDPWD": "olddir42"})
    assert secrets.redact("x hfvalue123 /usr/bin") == "x *** /usr/bin"
    # PWD reads as "password" but is the working directory: learned, it masked every path under it
    assert secrets.redact("cd projdir42/run; cd olddir42") == "cd projdir42/run; cd olddir42"
    _fresh()


SECRET_ARGS = ["engine=server", "engine.base_url=\"http://alice:pa'ss@w0rd@127.0.0.1:9/v1?hf_token=QRYSECRET\"",
               "+engine.default_headers.X-Access-Token=HDRSECRET"]
LEAKS = ("pa'ss", "ss@w0rd", "w0rd", "QRYSECRET", "HDRSECRET", "alice")


def _assert_clean(root: Path, *texts: str) -> None:
    for path in [p for p in root.rglob("*") if p.is_file()]:
        data = path.read_bytes()
        for s in LEAKS:
            assert s.encode() not in data, (path, s, data[:2000])
    for text in texts:
        for s in LEAKS:
            assert s not in text, (s, text[-2000:])


@pytest.mark.parametrize("module, args", [
    ("fp8eval.power", ["power.delta=5", "task.limit=20"]),
    ("fp8eval.pareto", ["divergence.lengths=[-5]"]),
    ("fp8eval", ["report=false", "engine.max_retries=0"]),
    ("fp8eval.divergence", ["divergence.lengths=[0]"]),
])
def test_no_secret_form_in_any_file_or_stream_of_a_wing(tmp_path, module, args):
    """power and pareto wrote URL passwords into .hydra/*.yaml; a `'`, a raw `@`, a custom header and a
    `?hf_token=` query leaked from the main command."""
    proc = cli(tmp_path, module, *SECRET_ARGS, *args, "hydra.run.dir=run", f"records_dir={tmp_path / 'rec'}")
    assert (tmp_path / "run" / ".hydra" / "config.yaml").is_file(), proc.stderr
    _assert_clean(tmp_path, proc.stdout, proc.stderr)
    cfg_job = cli(tmp_path, module, *SECRET_ARGS, *args, "--cfg", "job")
    assert cfg_job.returncode == 0 and "X-Access-Token" in cfg_job.stdout, cfg_job.stderr
    _assert_clean(tmp_path, cfg_job.stdout, cfg_job.stderr)


# --- records that survive any completion, any line ---------------------------------------------------------
FAST = ["engine=fake", "task.lengths=[1024]", "task.depths=[0,100]", "task.needles_per_cell=1", "anatomy=false"]


def test_a_lone_surrogate_completion_is_escaped_counted_and_reruns_work(tmp_path):
    script = tmp_path / "script.jsonl"
    script.write_text('{"contains": "", "completion": "answer \\ud800 here"}\n')
    first = run_inprocess(tmp_path, [*FAST, f"engine.script={script}"], "a")
    arm = first["arms"]["fp8"]
    assert arm["n_records"] == 2 and arm["records_io"]["escaped_chars"] == 2
    lines = Path(arm["records"]).read_text(encoding="utf-8").splitlines()
    assert all(json.loads(x)["completion"] == "answer \ufffd here" and json.loads(x)["escaped_chars"] == 1
               for x in lines)
    again = run_inprocess(tmp_path, [*FAST, f"engine.script={script}"], "b")
    assert again["arms"]["fp8"]["requests_sent"] == 0 and again["arms"]["fp8"]["n_records"] == 2


def test_a_deeply_nested_line_is_set_aside_by_run_check_and_repair(tmp_path, capsys):
    from fp8eval.records.__main__ import main as records_cli

    first = run_inprocess(tmp_path, FAST, "a")
    path = Path(first["arms"]["fp8"]["records"])
    n_lines = len(path.read_text().splitlines())
    with open(path, "a") as f:
        f.write("[" * 200_000 + "]" * 200_000 + "\n")
        f.write('{"a":' * 100_000 + "1" + "}" * 100_000 + "\n")
    again = run_inprocess(tmp_path, FAST, "b")
    assert again["arms"]["fp8"]["n_ignored"] == {"corrupt_line": 2} and again["arms"]["fp8"]["requests_sent"] == 0
    assert records_cli(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:{n_lines + 1}: corrupt_line" in out and f"{path}:{n_lines + 2}: corrupt_line" in out
    assert records_cli(["repair", str(path)]) == 0
    assert len(path.read_text().splitlines()) == n_lines


def test_check_lists_other_arm_and_superseded_lines_with_file_and_line(tmp_path, capsys):
    from fp8eval.records import read_records
    from fp8eval.records.__main__ import main as records_cli

    first = run_inprocess(tmp_path, FAST, "a")
    base, var = Path(first["arms"]["bf16"]["records"]), Path(first["arms"]["fp8"]["records"])
    n = len(var.read_text().splitlines())
    with open(var, "a") as f:
        f.write(json.dumps(read_records(base)[0]) + "\n")  # another arm's record: line n+1
        f.write(var.read_text().splitlines()[0] + "\n")  # a duplicate: line n+2 (or line 1) is superseded
    assert records_cli(["check", str(var)]) == 1
    out = capsys.readouterr().out
    assert f"{var}:{n + 1}: other_arm" in out
    assert f"{var}:1: superseded" in out or f"{var}:{n + 2}: superseded" in out


# --- CSV cells never formulas -----------------------------------------------------------------------------------
def test_every_formula_start_is_written_as_text(tmp_path):
    import pandas as pd

    from fp8eval.core.csvio import guard_cell, write_csv

    starts = ["=", "+", "-", "@", "\t", "\r"]
    bodies = ['HYPERLINK("http://x","y")', "1+1", "cmd|' /C calc'!A0", ""]
    cells = [s + b for s, b in itertools.product(starts, bodies)]
    frame = pd.DataFrame({"completion": cells, "gap": [-0.5] * len(cells), "ok": ["fine answer"] * len(cells)})
    assert write_csv(frame, tmp_path / "x.csv") == len(cells)
    import csv

    with open(tmp_path / "x.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["completion"] for r in rows] == ["'" + c for c in cells]
    assert all(r["gap"] == "-0.5" and r["ok"] == "fine answer" for r in rows)  # numbers and plain text untouched
    assert guard_cell(-3) == -3 and guard_cell("x=1") == "x=1" and guard_cell(math.nan) is not None


def test_every_csv_the_project_writes_goes_through_the_one_writer():
    offenders = [str(p.relative_to(REPO)) for d in ("fp8eval", "benchmarks", "scripts") for p in (REPO / d).rglob("*.py")
                 if p.name != "csvio.py" and (".to_csv(" in p.read_text() or "csv.writer(" in p.read_text()
                                              or "csv.DictWriter(" in p.read_text())]
    assert not offenders, offenders


# --- user texts: streamed, never used whole past the lengths -------------------------------------------------------
def test_a_large_text_is_read_only_as_far_as_its_tokens(tmp_path):
    from fp8eval.divergence.documents import read_texts, text_passages

    big = tmp_path / "big.txt"
    with open(big, "w") as f:
        for _ in range(40):
            f.write("word " * 200_000 + "\n")  # 40 MB
    seen = []

    def tok(s, add_special_tokens=True):
        seen.append(len(s))
        return {"input_ids": [0] + [len(w) for w in s.split()]}

    ps, counts = text_passages(tok, read_texts([str(big)]), [64])
    assert [p.length for p in ps] == [64] and counts["used_whole"] == 0
    assert max(seen) < 100_000, seen  # characters tokenized: a few KB, not 40 MB
    small = tmp_path / "small.txt"
    small.write_text("a b c")
    ps, counts = text_passages(tok, read_texts([str(small)]), [64])
    assert [p.length for p in ps] == [4] and counts["used_whole"] == 1
    with pytest.raises(ValueError, match="no length to cut the texts to"):
        text_passages(tok, read_texts([str(big)]), [])


# --- the moderate list --------------------------------------------------------------------------------------
def test_an_anatomy_step_that_crashes_still_leaves_summary_json_with_the_error_counted(tmp_path, monkeypatch):
    from fp8eval.engines.fake import FakeEngine

    def broken(self, req, forced_text, other_text):
        raise KeyError("the engine fell over")

    monkeypatch.setattr(FakeEngine, "teacher_force", broken)
    args = ["engine=fake", "task.lengths=[1024,2048]", "task.depths=[0,50,100]", "task.needles_per_cell=2",
            "+engine.engine_args.fake_fp8_error=0.5"]
    s = run_inprocess(tmp_path, args, "a")
    a = s["anatomy"]["fp8"]
    assert a["flips"] >= 1 and a["errors"] == a["flips"] and a["computed"] == 0
    assert a["failed"].startswith("KeyError") and (tmp_path / "a" / "summary.json").is_file()


def test_a_full_disk_while_claiming_is_one_line_and_leaves_no_empty_claim(tmp_path, monkeypatch):
    import errno

    from fp8eval.records import claims as claims_mod

    c = claims_mod.Claims(tmp_path / "arm.claims").register()
    try:
        def full(fd, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(claims_mod.os, "write", full)
        with pytest.raises(claims_mod.RecordsIOError) as e:
            c.try_claim("abc.0")
        assert "ENOSPC" in str(e.value) and "free some space" in str(e.value) and "\n" not in str(e.value)
        assert not (tmp_path / "arm.claims" / "abc.0").exists()
    finally:
        monkeypatch.undo()
        c.close()


def _server_run(tmp_path, srv, *extra):
    from conftest import run_cli

    return run_cli(tmp_path, ["engine=server", f"engine.base_urls.bf16={srv.url}", "kv=bf16", "baseline=none",
                              "task.lengths=[512]", "task.depths=[0]", "task.needles_per_cell=1", "report=false",
                              "engine.max_retries=0", "hydra.run.dir=run", *extra], check=False)


def test_a_tokenize_count_that_is_not_a_number_is_one_line(tmp_path):
    from fake_openai_server import FakeOpenAIServer

    with FakeOpenAIServer(model="HuggingFaceTB/SmolLM2-135M-Instruct") as srv:
        srv.tokenize_fn = lambda body: {"count": "many", "max_model_len": 4096, "tokens": []}
        proc = _server_run(tmp_path, srv)
    assert proc.returncode == 2 and "/tokenize answered count='many'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and srv.generation_calls == 0


def test_url_and_url_slash_are_one_replica():
    from fp8eval.engines.pool import replica_key

    same = ["http://h:8000", "http://h:8000/", "HTTP://H:8000/v1/", "http://h:8000/v1"]
    assert len({replica_key(u) for u in same}) == 1
    assert replica_key("http://h") == replica_key("http://h:80/")
    assert len({replica_key(u) for u in ["http://h:8000", "http://h:8001", "https://h:8000", "http://g:8000"]}) == 4


def test_url_and_url_slash_listed_together_are_refused(tmp_path):
    from fake_openai_server import FakeOpenAIServer

    with FakeOpenAIServer(model="HuggingFaceTB/SmolLM2-135M-Instruct") as srv:
        proc = _server_run(tmp_path, srv, f"engine.base_urls.bf16=[{srv.url},{srv.url}/]")
    assert proc.returncode == 2 and "lists one server more than once" in proc.stderr, proc.stderr


def test_trusting_a_declared_kv_that_is_not_served_says_so_on_the_terminal(tmp_path):
    from fake_openai_server import FakeOpenAIServer

    with FakeOpenAIServer(model="HuggingFaceTB/SmolLM2-135M-Instruct", cache_dtype="fp8") as srv:
        proc = _server_run(tmp_path, srv, "engine.trust_declared_kv=true")
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stderr.splitlines() if x.startswith("warning: kv=bf16"))
    assert "does not run the KV cache this arm asks for" in line and "trust_declared_kv=true" in line


def test_a_tokenize_that_ignores_its_input_is_detected():
    from fp8eval.engines.base import EngineError, Request
    from fp8eval.engines.server.forcing import teacher_force

    class Deaf:  # a server whose /tokenize answers the same ids whatever it is asked
        model_id = "m"

        def post_json(self, path, body, refused):
            return {"count": 3, "tokens": [1, 2, 3]}

    req = Request(id="r", messages=({"role": "user", "content": "q"},), n=1, seeds=(0,), sampling={})
    with pytest.raises(EngineError, match="does not tokenize its input"):
        teacher_force(Deaf(), req, "the answer is 4", "the answer is 5")


def test_pareto_exits_non_zero_when_no_point_was_measured(monkeypatch, capsys, tmp_path):
    import fp8eval.pareto.__main__ as pm

    result = {"points": [], "pick": None, "pick_reason": "no point", "serve": None,
              "counts": {"planned": 2, "infeasible": 0, "measured": 0, "errors": 2}}
    monkeypatch.setattr("fp8eval.pareto.sweep.run", lambda cfg, run_dir, out=print: result)
    assert pm.run_wing(None, tmp_path) == 2
    assert "no point was measured (2 failed, 0 infeasible of 2" in capsys.readouterr().err


def test_a_secret_printed_in_pieces_is_redacted_whole():
    import io

    _fresh()
    sink = io.StringIO()
    stream = secrets.RedactingStream(sink)
    print("X-Access-Token:", "PIECESECRET", file=stream)
    print("progress 3/4", end="\r", file=stream)
    stream.write("partial hf_token=TAILSECRET")
    assert "TAILSECRET" not in sink.getvalue()  # not yet written: the line is not over
    stream.flush()
    assert sink.getvalue() == "X-Access-Token: ***\nprogress 3/4\rpartial hf_token=***"
    _fresh()


def test_a_hand_written_lone_surrogate_line_is_read_escaped_and_the_report_is_written(tmp_path):
    from fp8eval.records import read_records
    from fp8eval.report import write_report

    args = [*FAST, "+engine.engine_args.fake_fp8_error=0.5"]
    first = run_inprocess(tmp_path, args, "a")
    var = Path(first["arms"]["fp8"]["records"])
    rec = dict(read_records(var)[0], time="9999-01-01T00:00:00+00:00", completion="=HYPERLINK(\ud800)")
    with open(var, "a", encoding="ascii") as f:
        f.write(json.dumps(rec) + "\n")  # ensure_ascii: the surrogate as the JSON escape \ud800
    again = run_inprocess(tmp_path, args, "b")
    assert again["arms"]["fp8"]["requests_sent"] == 0 and again["arms"]["fp8"]["n_records"] == 2
    [got] = [r for r in read_records(var) if r["time"].startswith("9999")]
    assert got["completion"] == "=HYPERLINK(\ufffd)" and got["escaped_chars"] == 1
    (tmp_path / "b" / ".hydra").mkdir()
    (tmp_path / "b" / ".hydra" / "config.yaml").write_text(
        "model: {name: smollm2-135m}\ntask: {name: niah}\nkv: {name: fp8}\nbaseline: bf16\n")
    out = write_report([tmp_path / "b"], tmp_path / "report")
    assert Path(out).exists()
