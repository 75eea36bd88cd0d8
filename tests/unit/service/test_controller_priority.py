"""Foreground-first data path: all-or-nothing loads, victims per restore, background
credits that give way, prefetches recalled at their due time (pure: no Ray, no bytes)."""

from __future__ import annotations

import threading
import time

import pytest

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.guard import Guarded
from agentkv_cluster.runtime.link_credits import Abandoned, Link, LinkCredits
from agentkv_cluster.runtime.records import Action, ActionKind, Reason
from agentkv_cluster.runtime.strategies import make_strategy
from store.types import Codec, Tier
from tests.unit.service.test_controller import MB, admitted, done, finish


def test_a_load_that_cannot_fit_restores_nothing_instead_of_a_part() -> None:
    ctl = Controller(make_strategy("lru"))
    ctl.add_hbm("h", 2 * MB)
    admitted(ctl, "a", range(2), 0.0)
    finish(ctl, admitted(ctl, "b", range(2), 1.0), 1.0)  # a's pages are in the pool now
    (gb0, _) = ctl.table.resolve("t", "b", [b"b/0", b"b/1"])
    ctl.access([gb0], 2.0)  # one of b's pages pinned: 1 MB left to evict, a needs 2 MB
    gids_a = ctl.table.resolve("t", "a", [b"a/0", b"a/1"])
    demotes, restores, lost, blocked = ctl.access(gids_a, 3.0)
    assert (demotes, restores, lost, blocked) == ([], [], [], gids_a)
    assert all(ctl.table.pages[g].pins == 0 and not ctl.table.pages[g].resident for g in gids_a)


def test_each_restore_names_only_the_victims_that_made_its_room() -> None:
    ctl = Controller(make_strategy("lru"))
    ctl.add_hbm("h", 2 * MB)
    admitted(ctl, "a", range(2), 0.0)
    finish(ctl, admitted(ctl, "b", range(2), 1.0), 1.0)
    gids_a = ctl.table.resolve("t", "a", [b"a/0", b"a/1"])
    gids_b = ctl.table.resolve("t", "b", [b"b/0", b"b/1"])
    demotes, restores, _, _ = ctl.access(gids_a, 2.0)
    assert [ctl.take_victims(r.gid) for r in restores] == [[gids_b[0]], [gids_b[1]]]
    assert ctl.take_victims(restores[0].gid) == []  # handed out once
    finish(ctl, demotes + restores, 2.0)


def test_background_waits_while_foreground_queues_and_gives_up_when_wanted() -> None:
    credits = LinkCredits(per_link=1, per_session=4)
    link = Link("p", "h")
    bg = link.as_background()
    fg = credits.acquire("s1", link)  # the link is full of foreground work
    got: list[str] = []

    def background() -> None:
        try:
            grant = credits.acquire("s2", bg, timeout_s=5.0, give_up=lambda: wanted.is_set())
            credits.release(bg, grant)
            got.append("ran")
        except Abandoned:
            got.append("abandoned")

    wanted = threading.Event()
    t = threading.Thread(target=background)
    t.start()
    time.sleep(0.1)
    assert got == [] and credits.in_flight[bg] == 0  # not admitted
    wanted.set()
    t.join(5.0)
    assert got == ["abandoned"]
    credits.release(link, fg)
    grant = credits.acquire("s2", bg, timeout_s=1.0)  # link idle: admitted
    credits.release(bg, grant)
    assert sum(credits.in_flight.values()) == 0


def test_wanted_pages_make_background_moves_give_way() -> None:
    ctl = Guarded(Controller(make_strategy("agentkv")))
    ctl.add_hbm("h", 4 * MB)
    admitted(ctl, "a", range(1), 0.0)
    (g,) = ctl.table.resolve("t", "a", [b"a/0"])
    assert not ctl.table.demand.wanted(g)
    ctl.table.evict(ctl.table.pages[g], tracked=True)  # being demoted: a load must wait
    ctl.table.pages[g].busy = True
    waiter = threading.Thread(target=ctl.wait_idle, args=([g], 5.0))
    waiter.start()
    deadline = time.monotonic() + 2.0
    while not ctl.table.demand.wanted(g) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ctl.table.demand.wanted(g)  # an engine waits for it
    with ctl.cv:
        ctl.table.pages[g].busy = False
        ctl.cv.notify_all()
    waiter.join(5.0)
    assert not ctl.table.demand.wanted(g)


def test_a_due_prefetch_recalls_its_page_still_moving_out() -> None:
    ctl = Controller(make_strategy("agentkv"))
    ctl.add_hbm("h", 4 * MB)
    admitted(ctl, "a", range(1), 0.0)
    (g,) = ctl.table.resolve("t", "a", [b"a/0"])
    rec = ctl.table.pages[g]
    ctl.table.evict(rec, tracked=True)  # a gap migration is in flight
    rec.busy = True
    rec.copies = {Codec.INT4: Tier.HOST}
    prefetch = Action(kind=ActionKind.RESTORE, gid=g, hbm="h", tier=Tier.HOST,
                      codec=Codec.INT4, start_at=1.0, reason=Reason.PREFETCH, session="a")
    ctl.schedule.push(prefetch, at=1.0)
    assert ctl.due(1.0) == [] and ctl.table.demand.wanted(g)  # recalled, looked at again shortly
    assert ctl.schedule.next_due() == pytest.approx(1.02)
    migration = Action(kind=ActionKind.DEMOTE, gid=g, hbm="h", tier=Tier.HOST,
                       codec=Codec.INT4, reason=Reason.GAP, session="a")
    ctl.finished(done(migration, pool="p"), 1.01)
    assert not ctl.table.demand.wanted(g)
    (restore,) = ctl.due(1.05)
    assert (restore.kind, restore.reason, restore.codec) == (
        ActionKind.RESTORE, Reason.PREFETCH, Codec.INT4)
