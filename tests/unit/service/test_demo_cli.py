"""`agentkv demo` argument checks and round order (no Ray needed)."""

from __future__ import annotations

import pytest

from agentkv_cluster.api.compare import RatioInterval
from agentkv_cluster.api.workload import Access
from agentkv_cluster.cli import main
from agentkv_cluster.cli.demo import _ratio_line, by_session, round_order


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


def _access(session: str, delay_ms: float) -> Access:
    return Access(session=session, source="host", delay_ms=delay_ms, hidden_ms=0.0, nbytes=1)


def test_a_runs_delays_are_grouped_per_session_in_session_order() -> None:
    """The units the demo's P95 interval resamples: session j of one run, whatever the
    order accesses arrived in; other runs' sessions (``lru10`` is not ``lru1``) are not
    counted, and a session with no access is an empty unit, so policies stay paired."""
    accesses = [_access("lru1-s2", 5.0), _access("lru1-s0", 1.0), _access("lru10-s0", 99.0),
                _access("lru1-s0", 2.0), _access("agentkv1-s1", 42.0)]
    assert by_session(accesses, "lru1", 4) == [[1.0, 2.0], [], [5.0], []]


@pytest.mark.parametrize(("low", "high", "says"), [(0.8, 1.3, "cannot tell"),
                                                    (0.5, 0.9, "AgentKV faster"),
                                                    (1.1, 1.6, "AgentKV slower")])
def test_the_ratio_line_says_what_its_interval_shows(low: float, high: float, says: str) -> None:
    line = _ratio_line(RatioInterval(ratio=(low + high) / 2, low=low, high=high, level=0.9))
    assert says in line and f"{low:.2f}-{high:.2f}" in line
