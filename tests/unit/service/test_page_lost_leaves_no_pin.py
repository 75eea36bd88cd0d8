"""A load of pages of which some have no copy left is
refused as ``page_lost`` and leaves no pin on its other pages, the ones already in HBM
(pinned by ``access`` before it found the lost ones): else they stayed pinned in no
session's pins, never evictable, for as long as the service ran (pure: no Ray)."""

from __future__ import annotations

import pytest

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.guard import Guarded
from agentkv_cluster.runtime.loads import EngineLoader, RefusedPageLost
from agentkv_cluster.runtime.records import Outcome
from agentkv_cluster.runtime.strategies import make_strategy
from tests.unit.service.test_controller import MB, admitted
from tests.unit.service.test_page_lost import _Worker


def test_a_load_with_a_lost_page_leaves_its_resident_pages_unpinned() -> None:
    ctl = Guarded(Controller(make_strategy("lru")))
    ctl.add_hbm("h", 8 * MB)
    admitted(ctl, "a", range(2), 0.0)
    kept, lost = ctl.table.resolve("t", "a", [b"a/0", b"a/1"])
    rec = ctl.manager.table.pages[lost]
    ctl.manager.table.evict(rec, tracked=True)
    rec.copies, rec.pool = {}, "p"  # its pool died with the only copy
    assert ctl.manager.table.pages[kept].resident
    loader = EngineLoader(ctl, _Worker(ctl, Outcome.DONE), check=lambda results: None)
    with pytest.raises(RefusedPageLost, match="no copy left"):
        loader.load("t", "a", [b"a/0", b"a/1"])
    page = ctl.manager.table.pages[kept]
    assert page.pins == 0 and not page.view.pinned
