"""A load waits for room all or nothing: while the HBM is
full of pinned pages it holds none of its own pages pinned (holding some while waiting
deadlocks a herd of loads), and refused as busy at its deadline it leaves none pinned
(pure: no Ray)."""

from __future__ import annotations

import contextlib

import pytest

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.guard import Guarded
from agentkv_cluster.runtime.loads import EngineLoader, RefusedBusy
from agentkv_cluster.runtime.records import Outcome
from agentkv_cluster.runtime.strategies import make_strategy
from store.types import Codec, Tier
from tests.unit.service.test_controller import MB, admitted
from tests.unit.service.test_page_lost import _Worker


class _RoomWorker(_Worker):
    """The stand-in transfer worker, with no prefetch to hand room back."""

    def room_wanted(self, hbms: set[str]) -> contextlib.AbstractContextManager[int]:
        return contextlib.nullcontext(0)


def test_a_load_refused_for_room_leaves_its_resident_page_unpinned() -> None:
    ctl = Guarded(Controller(make_strategy("lru")))
    ctl.add_hbm("h", 2 * MB)
    admitted(ctl, "a", range(2), 0.0)
    here, away = ctl.table.resolve("t", "a", [b"a/0", b"a/1"])
    rec = ctl.manager.table.pages[away]
    ctl.manager.table.evict(rec, tracked=True)  # its only copy in the host pool
    rec.copies, rec.pool = {Codec.FULL: Tier.HOST}, "p"
    admitted(ctl, "b", range(1), 0.1)  # the HBM is full again ...
    (other,) = ctl.table.resolve("t", "b", [b"b/0"])
    ctl.access([other], 0.2)  # ... and b's page is pinned by b's load
    loader = EngineLoader(ctl, _RoomWorker(ctl, Outcome.DONE), check=lambda results: None)
    loader.deadline_s = 0.3
    with pytest.raises(RefusedBusy, match="pinned pages"):
        loader.load("t", "a", [b"a/0", b"a/1"])
    page = ctl.manager.table.pages[here]
    assert page.resident and page.pins == 0 and not page.view.pinned
