"""A session nobody closes is closed by the service once unused for
``controller.idle_session_s``, exactly as ``close_session`` would; one in use stays."""

from __future__ import annotations

import time

import pytest

from agentkv_cluster.api.protocol import RemoteError
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration

IDLE_S = 2.0


def test_an_abandoned_session_is_closed_and_a_busy_one_is_kept() -> None:
    with local_service("agentkv-idle-", page_bytes=1 << 17, hbm_pages=8, pool_bytes=4 << 20,
                       controller={"idle_session_s": IDLE_S}) as svc, \
            svc.client("acme") as client:
        abandoned = client.open_session("abandoned")
        lost = abandoned.store_pages([kv_page(0, "evidence", identity("acme", "abandoned", 0))])
        busy = client.open_session("busy")
        kept = busy.store_pages([kv_page(1, "evidence", identity("acme", "busy", 1))])
        table = svc.topo.controller.target.controller.manager.table  # local mode: the actor
        deadline = time.monotonic() + 60.0
        while svc.stats()["sessions_idle_closed"] < 1:
            assert time.monotonic() < deadline, "the abandoned session was never closed"
            busy.release(kept)  # a cheap call that succeeds: the session is in use
            time.sleep(0.1)
        assert ("acme", "abandoned") not in table.sessions
        assert ("acme", "busy") in table.sessions
        with pytest.raises(RemoteError) as err:
            abandoned.prepare_load(lost)
        assert err.value.code == "not_found"
        assert len(busy.load(kept)) == 1  # the busy one lost nothing
        busy.release(kept)
        assert abandoned.close()["closed"] is False  # closed already: the close is idempotent
