"""A store that waits for staging slots before its first controller call while its tenant
is erased, the name provisioned again and a session of the same name opened by a new
token: once it has its slots it is refused, and nothing of it lands in the new session.
(The later calls of a store that spans the erasure: test_store_spans_erasure.py.) The
wait for slots is injected around the front's ``_staged``; service in local mode: real
NIXL, /dev/shm, files and AES-GCM."""

from __future__ import annotations

import threading

import pytest

from agentkv_cluster.api.protocol import RemoteError
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.integration.runtime.test_metrics import PAGE
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


@pytest.fixture
def service():
    with local_service("agentkv-store-waits-", page_bytes=PAGE, hbm_pages=16,
                       pool_bytes=16 * PAGE) as svc:
        yield svc


def test_a_store_erased_while_it_waited_for_slots_is_refused(service, monkeypatch) -> None:
    pages = [kv_page(i, "evidence", identity("acme", "agent-7", 128 * i)) for i in range(2)]
    old = service.client("acme").open_session("agent-7")  # authenticated before the erasure
    real, waiting, go = service.front._staged, threading.Event(), threading.Event()

    def staged(n: int):
        if not waiting.is_set():  # the store's first chunk: no slot free for a while
            waiting.set()
            assert go.wait(60.0)
        return real(n)

    monkeypatch.setattr(service.front, "_staged", staged)
    out: list[object] = []

    def store() -> None:
        try:
            out.append(old.store_pages(pages))
        except RemoteError as exc:
            out.append(exc)

    thread = threading.Thread(target=store)
    thread.start()
    assert waiting.wait(60.0)
    assert not service.erase_tenant("acme").failed_tiers
    fresh = service.client("acme").open_session("agent-7")  # the name anew, same session
    go.set()
    thread.join(60.0)
    assert isinstance(out[0], RemoteError), "a pre-erasure store landed after the receipt"
    assert out[0].code in ("unauthenticated", "tenant_erased"), out[0]
    assert fresh.lookup_prefix([p["identity"] for p in pages])["length"] == 0
