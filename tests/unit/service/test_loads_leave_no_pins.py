"""A load that fails leaves no pin on its pages already in HBM (pure: no Ray).

- Some pages have no copy left: refused as ``page_lost``, its other pages (pinned by
  ``access`` before it found the lost ones) are unpinned; else they stayed pinned in no
  session's pins, never evictable, for as long as the service ran.
- The HBM is full of pinned pages: a load waits for room all or nothing, holding none of
  its own pages pinned meanwhile (holding some while waiting deadlocks a herd of loads),
  and refused as busy at its deadline it leaves none pinned."""

from __future__ import annotations

import contextlib

import pytest

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.guard import Guarded
from agentkv_cluster.runtime.loads import EngineLoader, RefusedBusy, RefusedPageLost
from agentkv_cluster.runtime.records import Outcome
from agentkv_cluster.runtime.strategies import make_strategy
from store.types import Codec, Tier
from tests.unit.service.test_controller import MB, admitted
from tests.unit.service.test_page_lost import _Worker


class _RoomWorker(_Worker):
    """The stand-in transfer worker, with no prefetch to hand room back."""

    def room_wanted(self, hbms: set[str]) -> contextlib.AbstractContextManager[int]:
        return contextlib.nullcontext(0)


def _two_pages(hbm_mb: int, copies: dict[Codec, Tier]) -> tuple[Guarded, int]:
    """Session a's pages a/0 (in HBM; its gid returned) and a/1 (pushed out, with
    ``copies`` in pool p) on an LRU manager with ``hbm_mb`` MB of HBM."""
    ctl = Guarded(Controller(make_strategy("lru")))
    ctl.add_hbm("h", hbm_mb * MB)
    admitted(ctl, "a", range(2), 0.0)
    here, away = ctl.table.resolve("t", "a", [b"a/0", b"a/1"])
    rec = ctl.manager.table.pages[away]
    ctl.manager.table.evict(rec, tracked=True)
    rec.copies, rec.pool = dict(copies), "p"
    return ctl, here


def test_a_load_with_a_lost_page_leaves_its_resident_pages_unpinned() -> None:
    ctl, kept = _two_pages(8, {})  # its pool died with the only copy
    assert ctl.manager.table.pages[kept].resident
    loader = EngineLoader(ctl, _Worker(ctl, Outcome.DONE), check=lambda results: None)
    with pytest.raises(RefusedPageLost, match="no copy left"):
        loader.load("t", "a", [b"a/0", b"a/1"])
    page = ctl.manager.table.pages[kept]
    assert page.pins == 0 and not page.view.pinned


def test_a_load_refused_for_room_leaves_its_resident_page_unpinned() -> None:
    ctl, here = _two_pages(2, {Codec.FULL: Tier.HOST})  # its only copy in the host pool
    admitted(ctl, "b", range(1), 0.1)  # the HBM is full again ...
    (other,) = ctl.table.resolve("t", "b", [b"b/0"])
    ctl.access([other], 0.2)  # ... and b's page is pinned by b's load
    loader = EngineLoader(ctl, _RoomWorker(ctl, Outcome.DONE), check=lambda results: None)
    loader.deadline_s = 0.3
    with pytest.raises(RefusedBusy, match="pinned pages"):
        loader.load("t", "a", [b"a/0", b"a/1"])
    page = ctl.manager.table.pages[here]
    assert page.resident and page.pins == 0 and not page.view.pinned
