"""Loading keeps progress bars off stderr unless asked, and changes nothing it keeps."""

from __future__ import annotations

import sys

import pytest
from tqdm.auto import tqdm

from agentkv_cluster.engines.model import progress_output


def _draw_bar() -> None:
    for _ in tqdm(range(5), desc="Converting tensors", mininterval=0):
        pass


def test_a_bar_drawn_with_tqdm_directly_stays_off_stderr(capsys):
    before = sys.stderr
    with progress_output(False):
        _draw_bar()
    assert sys.stderr is before
    assert capsys.readouterr().err == ""


def test_asking_for_progress_shows_the_bar(capsys):
    with progress_output(True):
        _draw_bar()
    assert "Converting tensors" in capsys.readouterr().err


def test_warnings_written_while_loading_still_reach_stderr(capsys):
    with progress_output(False):
        _draw_bar()
        print("careful: tied weights", file=sys.stderr)  # as warnings.showwarning writes
        _draw_bar()
    assert capsys.readouterr().err == "careful: tied weights\n"


def test_a_failed_load_puts_stderr_back_and_shows_what_it_wrote(capsys):
    before = sys.stderr
    with pytest.raises(OSError, match="no such file"), progress_output(False):
        print("loading weights from x.gguf", file=sys.stderr)
        raise OSError("no such file")
    assert sys.stderr is before
    assert capsys.readouterr().err == "loading weights from x.gguf\n"
