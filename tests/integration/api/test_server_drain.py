"""``ApiServer.stop`` returns once the requests already running have ended (at most
``DRAIN_S``): the service tears down what they call only then. ``agentkv demo
--sessions 600`` stopped its service with requests still running; one of them called Ray
after ``ray.shutdown``, Ray ended the process with status 1, and the demo's own error was
never printed."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from agentkv_cluster.api.client import AgentKvClient
from agentkv_cluster.api.server import ApiServer
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


class _Slow:
    """The service's own backend, with an ``open_session`` that takes a while."""

    def __init__(self, inner: object) -> None:
        self.inner, self.ended = inner, threading.Event()

    def open_session(self, principal: object, session: str) -> dict:
        time.sleep(0.5)
        try:
            return self.inner.open_session(principal, session)  # type: ignore[attr-defined]
        finally:
            self.ended.set()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


@contextlib.contextmanager
def _running_request(prefix: str, call: Callable[[AgentKvClient], object]
                     ) -> Iterator[tuple[ApiServer, _Slow, AgentKvClient, threading.Thread]]:
    """A local service whose ``open_session`` is slow, with ``call(client)`` running on a
    thread and already inside the server's request pool."""
    with local_service(prefix, page_bytes=1 << 16, hbm_pages=4, pool_bytes=1 << 20) as svc:
        server = svc.server
        slow = _Slow(server.backend)
        server.backend = slow
        client = svc.client("acme")
        caller = threading.Thread(target=call, args=(client,), daemon=True)
        caller.start()
        deadline = time.monotonic() + 10
        while server._running == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server._running == 1  # in the pool, 0.5 s from its end
        yield server, slow, client, caller
        client.close()


def test_stop_waits_for_the_requests_already_running() -> None:
    with _running_request("agentkv-drain-", lambda c: _quiet(c.open_session, "s")) as (
            server, slow, _client, _caller):
        server.stop()
        assert slow.ended.is_set()  # it ended before stop returned
        assert server._running == 0


def _quiet(call: object, *args: object) -> None:
    try:
        call(*args)  # type: ignore[operator]
    except Exception:  # noqa: BLE001, S110 - the server went away under it: expected
        pass


def test_a_request_running_at_stop_gets_its_reply() -> None:
    """The request ends after ``stop`` began; its reply still reaches the client before the
    connection closes (``stop`` cancelled the connections first, and the reply, say a
    stopping service's ``busy``, was lost as "server closed the connection")."""
    got: list[object] = []

    def call(client: AgentKvClient) -> None:
        try:
            got.append(client.open_session("s"))
        except Exception as exc:  # noqa: BLE001 - recorded, asserted below
            got.append(exc)

    with _running_request("agentkv-drain-reply-", call) as (server, _slow, _client, caller):
        server.stop()
        caller.join(10)
    (reply,) = got
    assert not isinstance(reply, Exception), reply
    assert reply.session == "s" and reply.opened["session"] == "s"
