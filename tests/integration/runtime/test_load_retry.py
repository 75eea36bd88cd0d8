"""``SessionClient.load`` outlives pin churn: when its pins are revoked for another tenant
between ``prepare_load`` and ``complete_load`` (a real revocation on a running service:
real arena, host pool, NVMe shard, NIXL), it prepares the load again and returns the right
bytes; a load of a session that is not open still fails at once."""

from __future__ import annotations

import pytest

from agentkv_cluster.api import client as client_mod
from agentkv_cluster.api.protocol import RemoteError
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.integration.runtime.test_fair_share import ARENA, PAGE, _fair_round
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


@pytest.fixture
def service():
    with local_service("agentkv-load-retry-", page_bytes=PAGE, hbm_pages=ARENA,
                       pool_bytes=64 * PAGE) as svc:
        yield svc


def test_a_load_whose_pins_were_revoked_is_prepared_again(service, monkeypatch) -> None:
    with service.client("greedy") as client:
        s = client.open_session("pin")
        pages = [kv_page(i, "evidence", identity("greedy", "pin", 1000 * i))
                 for i in range(ARENA)]
        keys = s.store_pages(pages)
        outcomes: list[str] = []
        complete = client_mod.SessionClient.complete_load

        def churned(self, load_id, *args, **kwargs):
            if self is not s:  # the other tenant's own loads
                return complete(self, load_id, *args, **kwargs)
            if not outcomes:  # between the first prepare and its complete: another
                _fair_round(service, "churn")  # tenant needs the room this load pinned
            try:
                done = complete(self, load_id, *args, **kwargs)
            except RemoteError as exc:
                outcomes.append(exc.code)
                raise
            outcomes.append("ok")
            return done

        monkeypatch.setattr(client_mod.SessionClient, "complete_load", churned)
        assert s.load(keys) == [p["data"] for p in pages]
        assert outcomes[0] == "not_found" and outcomes[-1] == "ok", outcomes
        s.release(keys)


def test_a_load_of_a_closed_session_fails_at_once(service, monkeypatch) -> None:
    prepares: list[int] = []
    prepare = client_mod.SessionClient.prepare_load
    monkeypatch.setattr(client_mod.SessionClient, "prepare_load",
                        lambda self, keys: prepares.append(1) or prepare(self, keys))
    with service.client("acme") as client:
        s = client.open_session("gone")
        keys = s.store_pages([kv_page(0, "evidence", identity("acme", "gone", 0))])
        s.close()
        with pytest.raises(RemoteError) as err:
            s.load(keys)
        assert err.value.code == "not_found" and len(prepares) == 1
