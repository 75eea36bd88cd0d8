"""Loading the real model leaves stderr clean unless asked, and the caller's settings as
they were."""

from __future__ import annotations

import sys

import pytest
from transformers.utils import logging as hf_logging

from agentkv_cluster.engines.model import load_model

pytestmark = pytest.mark.slow


def test_loading_draws_no_progress_bar_and_changes_no_setting(capfd):
    stderr, bars = sys.stderr, hf_logging.is_progress_bar_enabled()
    loaded = load_model()
    assert loaded.num_layers == 30
    assert (sys.stderr, hf_logging.is_progress_bar_enabled()) == (stderr, bars)
    err = capfd.readouterr().err
    assert "de-quantizing" not in err and "%|" not in err
