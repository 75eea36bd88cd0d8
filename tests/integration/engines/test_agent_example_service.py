"""The agent example's in-process service (``examples/agent_loop.py --service``) starts
while something else holds the default port 7420, e.g. a running `agentkv serve`."""

from __future__ import annotations

import errno
import socket

import pytest

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
