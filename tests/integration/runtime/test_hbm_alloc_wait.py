"""An arena page for a new page waits a little for a drop on its way (real NIXL, real
/dev/shm; the HBM actor in this process): the manager's budget already counts the room a
page still being dropped will free, so the arena may be full for a moment."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from agentkv_cluster.runtime import arena_pages
from store.hbm import ArenaFull
from tests.support.local_topology import local_topology

pytestmark = pytest.mark.integration
MIB = 1 << 20


@pytest.fixture
def full(tmp_path):
    """An HBM actor whose every arena page is taken (two pages, the rest reserved for
    landing), and a front slot holding a page to ingest."""
    with local_topology(tmp_path, hbm_page=MIB, hbm_pages=2, pool_bytes=8 * MIB,
                        front_bytes=MIB, front_slots=1) as (topo, front):
        hbm = topo.hbms["node0-hbm0"]
        front.slot_view(0, MIB)[:] = np.arange(MIB, dtype=np.uint8)
        src = front.slot_span(0, MIB)
        hbm.reserve(64, "someone")  # every landing page
        for key in (b"a" * 32, b"b" * 32):
            hbm.ingest(key, src)
        stats = hbm.stats()
        assert stats["used_pages"] == stats["pages"] + stats["landing_pages"] == 10  # full
        yield hbm, src


def test_a_page_waits_for_a_drop_on_its_way(full) -> None:
    hbm, src = full
    dropper = threading.Timer(0.3, hbm.drop, args=(b"a" * 32,))
    t0 = time.monotonic()
    dropper.start()
    assert hbm.ingest(b"c" * 32, src) == MIB  # the drop freed its page meanwhile
    assert time.monotonic() - t0 >= 0.25
    assert hbm.read(b"c" * 32)[:MIB] == np.arange(MIB, dtype=np.uint8).tobytes()


def test_with_no_drop_coming_it_gives_up(full, monkeypatch) -> None:
    hbm, src = full
    monkeypatch.setattr(arena_pages, "ALLOC_WAIT_S", 0.2)
    with pytest.raises(ArenaFull):
        hbm.ingest(b"c" * 32, src)
    assert hbm.read(b"a" * 32)[:16] == bytes(range(16))  # nothing was lost
