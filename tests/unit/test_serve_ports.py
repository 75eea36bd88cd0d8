"""``agentkv serve`` checks its API and metrics ports before Ray starts, naming the flag."""

from __future__ import annotations

import socket

import pytest

from agentkv_cluster.cli import CliError
from agentkv_cluster.cli._serve_ports import check_ports
from agentkv_cluster.config import load_config


def _cfg(api: dict, metrics: dict):
    return load_config(env={}, overrides={"api": api, "metrics": metrics})


@pytest.fixture
def taken():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_taken_api_port_names_the_flag(taken: int) -> None:
    with pytest.raises(CliError, match=rf"^--port {taken}: 127.0.0.1:{taken} is already in "
                                       r"use \(api.port\)"):
        check_ports(_cfg({"port": taken}, {"port": 0}))


def test_a_taken_metrics_port_names_the_flag(taken: int) -> None:
    with pytest.raises(CliError, match=rf"^--metrics-port {taken}: .* \(metrics.port\)"):
        check_ports(_cfg({"port": 0}, {"port": taken}))


def test_a_taken_metrics_port_is_fine_when_metrics_are_off(taken: int) -> None:
    check_ports(_cfg({"port": 0}, {"port": taken, "enabled": False}))


def test_the_same_port_for_both_is_refused() -> None:
    with socket.socket() as sock:  # a port that is free now
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(CliError, match=f"--port and --metrics-port are both {port}"):
        check_ports(_cfg({"port": port}, {"port": port}))


def test_free_ports_and_port_zero_pass_and_stay_free() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    check_ports(_cfg({"port": port}, {"port": 0}))
    with socket.socket() as sock:  # let go again: the server can take it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


def test_a_host_that_does_not_resolve_is_a_one_line_error() -> None:
    with pytest.raises(CliError, match=r"host 'no-such-host.invalid' \(api.port\) does not "
                                       r"resolve"):
        check_ports(_cfg({"host": "no-such-host.invalid", "port": 7420}, {"port": 0}))
