"""Progress that moves: stage lines for work without a count, and other libraries' bars and noise kept out of logs."""

from __future__ import annotations

import io
import logging

import pytest

from fp8eval.core.progress import quiet_third_party, stage


def test_stage_says_when_it_starts_and_how_long_it_took(capsys):
    with stage("loading something"):
        pass
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "fp8eval: loading something ..." and err[1].startswith("fp8eval: loading something: done in ")
    with stage("quiet", enabled=False):
        pass
    assert capsys.readouterr().err == ""


def test_stage_lines_leave_a_failure_as_it_was(capsys):
    with pytest.raises(ValueError), stage("failing"):
        raise ValueError("x")
    assert "done in" not in capsys.readouterr().err  # a stage that failed never says it is done


def test_known_noise_is_filtered_and_nothing_else(caplog):
    quiet_third_party(io.StringIO())
    log = logging.getLogger("transformers.tokenization_utils_tokenizers")
    with caplog.at_level(logging.WARNING, logger=log.name):
        log.warning("Ignoring clean_up_tokenization_spaces=True for BPE tokenizer GPT2TokenizerFast. The ...")
        log.warning("a warning that matters")
    assert [r.getMessage() for r in caplog.records] == ["a warning that matters"]


def test_no_third_party_bars_outside_a_terminal():
    pytest.importorskip("transformers")
    from transformers.utils import logging as hf_logging

    quiet_third_party(io.StringIO())  # a log file: not a terminal
    assert not hf_logging.is_progress_bar_enabled()  # the nested "Loading weights" bar (its ESC[A) stays out
    bar = hf_logging.tqdm(range(3), desc="Loading weights")
    assert list(bar) == [0, 1, 2]


def test_report_building_moves(tmp_path, capsys):
    from test_report import GOLDEN

    from fp8eval.report import write_report

    write_report([GOLDEN], tmp_path / "r", n_boot=100, cache=False)
    err = capsys.readouterr().err
    for what in ("report: reading the runs' records", "report: pairing", "report: drawing the figures"):
        assert f"fp8eval: {what}" in err, err
    assert "\x1b[A" not in err


def test_the_bar_moves_before_the_first_sample_ends(monkeypatch):
    import sys
    import time

    from fp8eval.core.progress import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    screen = Tty()
    monkeypatch.setattr(sys, "stderr", screen)
    bar = Progress(9, "niah kv=fp8", True, tick=0.05)
    time.sleep(0.5)
    drawn = screen.getvalue().count("0/9")
    bar.close()
    assert drawn >= 3, screen.getvalue()  # redrawn while nothing finished: its clock is not frozen
    log = io.StringIO()  # a log file: no redraws (each would be one more line)
    monkeypatch.setattr(sys, "stderr", log)
    bar = Progress(9, "niah kv=fp8", True, tick=0.05)
    time.sleep(0.3)
    bar.close()
    assert log.getvalue().count("0/9") <= 2, log.getvalue()
