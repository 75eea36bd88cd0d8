"""A store whose HBM budget has room while the arena has none yet waits for the arena.

The budget frees a victim's bytes when its demotion starts; its arena page is freed at the
drop. Under a burst (``agentkv demo --sessions 600``) a concurrent store came in between,
its ingest found the arena full, and ``store_pages`` answered ``internal: ArenaFull``.
Here the arena's free pages are held the way pages on their way out hold them (taken
from the arena directly), then given back; the store must wait and land, not fail."""

from __future__ import annotations

import threading

import pytest

from agentkv_cluster.runtime import arena_pages
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration
PAGE = 2 * 2 * 2 * 128 * 64 * 2  # kv_page's geometry


def test_a_store_waits_for_arena_pages_on_their_way_out(monkeypatch) -> None:
    monkeypatch.setattr(arena_pages, "ALLOC_WAIT_S", 0.05)  # give up on each try at once
    with local_service("agentkv-arena-wait-", page_bytes=PAGE, hbm_pages=4,
                       pool_bytes=16 * PAGE) as svc:
        actor = svc.topo.hbms["node0-hbm0"].target
        with svc.client("acme") as client:
            session = client.open_session("s")
            session.store_pages([kv_page(0, "evidence", identity("acme", "s", 0))])
            held = []
            with actor.pages._lock:  # every free page, as drops on their way would hold them
                while True:
                    try:
                        held.append(actor.arena.alloc())
                    except arena_pages.ArenaFull:
                        break

            def give_back() -> None:
                with actor.pages._lock:
                    for page in held:
                        actor.arena.free(page)
                    actor.pages._lock.notify_all()

            threading.Timer(0.5, give_back).start()
            keys = session.store_pages([kv_page(1, "evidence", identity("acme", "s", 1000))])
            assert len(keys) == 1
            loaded = session.load(keys)
            assert len(loaded) == 1 and len(loaded[0]) > 0
