"""The agent example against an in-process service (``examples/agent_loop.py --service`` /
``--connect``): it starts while something else holds the default port 7420, a token the
service refuses is one line, and pages are named in the token's tenant."""

from __future__ import annotations

import errno
import socket

import pytest

from examples.agent_loop import main
from examples.agent_service import start_local_service

pytestmark = pytest.mark.integration

DEFAULT_PORT = 7420


def test_local_service_starts_while_the_default_port_is_taken():
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", DEFAULT_PORT))
        holder.listen()
    except OSError as exc:  # already held by someone else: the same situation
        if exc.errno != errno.EADDRINUSE:
            raise
    service, client = start_local_service("demo", ray=False)
    try:
        assert service.address[1] != DEFAULT_PORT
        assert client.open_session("agent-1").session == "agent-1"
    finally:
        client.close()
        service.stop()
        holder.close()


@pytest.fixture
def local_service():
    service, client = start_local_service("demo", ray=False)
    try:
        yield service
    finally:
        client.close()
        service.stop()


def _connect_argv(service, token: str) -> list[str]:
    host, port = service.address
    return ["--connect", f"{host}:{port}", "--token", token, "--no-compare"]


def test_a_refused_token_is_reported_in_one_line(local_service, capsys):
    assert main(_connect_argv(local_service, "not-a-token")) == 2
    err = capsys.readouterr().err
    assert "refused by AgentKV" in err and "invalid auth token" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_pages_are_named_in_the_tenant_of_the_token(local_service, capsys):
    # The service refuses pages named in another tenant's namespace than the token's.
    assert main(_connect_argv(local_service, local_service.token("acme"))) == 0
    out = capsys.readouterr().out
    assert "restored" in out and "from AgentKV" in out
