"""Pages whose only copy died with an actor are lost, never served from elsewhere (pure page
manager and loader, no Ray): an HBM actor that dies takes its pages' working copies, so
its sessions' pages with no pool copy are refused as ``page_lost`` on the HBM actor the
session moved to (whose budget holds none of them); a pool that dies counts the pages it
held the only copy of as lost."""

from __future__ import annotations

import pytest

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.guard import Guarded
from agentkv_cluster.runtime.loads import EngineLoader, RefusedPageLost
from agentkv_cluster.runtime.records import Outcome
from agentkv_cluster.runtime.strategies import make_strategy
from store.types import Codec, Tier
from tests.unit.service.test_controller import MB, admitted, finish
from tests.unit.service.test_page_lost import _Worker


def test_pages_of_a_dead_hbm_actor_with_no_pool_copy_are_lost_not_resident() -> None:
    ctl = Guarded(Controller(make_strategy("lru")))
    ctl.add_hbm("h0", 8 * MB, "p0")
    ctl.add_hbm("h1", 8 * MB, "p0")
    ctl.table.open_session("t", "other")  # h0 takes the first session, h1 this one
    finish(ctl.manager, admitted(ctl.manager, "s", range(2), 0.0), 0.0)
    assert ctl.table.session("t", "s").hbm == "h1"
    gids = ctl.table.resolve("t", "s", [b"s/0", b"s/1"])
    assert all(ctl.table.pages[g].resident and not ctl.table.pages[g].copies for g in gids)
    lost = ctl.remove_hbm("h1")
    assert sorted(lost) == sorted(gids) and ctl.stats["lost"] == 2
    assert ctl.table.session("t", "s").hbm == "h0"
    assert not any(ctl.table.pages[g].resident for g in gids)
    assert ctl.table.hbm_used()["h0"] == 0
    loader = EngineLoader(ctl, _Worker(ctl, Outcome.DONE), check=lambda results: None)
    with pytest.raises(RefusedPageLost, match="no copy left"):
        loader.load("t", "s", [b"s/0"])


def test_pages_whose_only_copy_was_on_a_dead_pool_count_as_lost() -> None:
    ctl = Controller(make_strategy("lru"))
    ctl.add_hbm("h0", 8 * MB, "p0")
    finish(ctl, admitted(ctl, "s", range(3), 0.0), 0.0)
    gids = ctl.table.resolve("t", "s", [b"s/0", b"s/1", b"s/2"])
    for gid in gids[:2]:  # demoted: their HBM copy went, one FULL copy in p0
        rec = ctl.table.pages[gid]
        ctl.table.evict(rec, tracked=True)
        rec.copies, rec.pool = {Codec.FULL: Tier.HOST}, "p0"
    ctl.table.pages[gids[2]].copies = {Codec.FULL: Tier.HOST}  # resident, and copied
    ctl.table.pages[gids[2]].pool = "p0"
    lost = ctl.remove_pool("p0")
    assert sorted(lost) == sorted(gids[:2]) and ctl.stats["lost"] == 2
    assert all(not ctl.table.pages[g].copies for g in gids)
    assert ctl.table.pages[gids[2]].resident  # its working copy in HBM lives on
