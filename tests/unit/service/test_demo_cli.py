"""`agentkv demo` argument checks and round order (no Ray needed)."""

from __future__ import annotations

import pytest

from agentkv_cluster.cli import main
from agentkv_cluster.cli.demo import round_order


def test_rounds_alternate_so_drift_hits_both_policies_alike() -> None:
    assert round_order(1) == ["agentkv", "lru"]
    assert round_order(2) == ["agentkv", "lru", "lru", "agentkv"]
    order = round_order(3)
    assert order.count("agentkv") == order.count("lru") == 3


@pytest.mark.parametrize("args", [["--rounds", "0"], ["--sessions", "0"], ["--turns", "0"],
                                  ["--budget", "2"]])
def test_bad_demo_arguments_exit_2_with_a_message(args: list[str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *args]) == 2
    assert "must be" in capsys.readouterr().err
