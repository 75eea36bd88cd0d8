"""The transfer worker's two lanes: an engine's work never waits for a thread behind
background moves, a background move an engine wants before it started gives way at once,
and a prefetch without its credit yet gives its HBM room to a load blocked for room there
(pure: no Ray, no bytes; the actions here need no actor)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from agentkv_cluster.lifecycle.types import SessionKey
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.executor import Executor
from agentkv_cluster.runtime.guard import Guarded
from agentkv_cluster.runtime.link_credits import Link, LinkCredits
from agentkv_cluster.runtime.records import Action, ActionKind, Outcome, Reason
from agentkv_cluster.runtime.strategies import make_strategy
from store.types import Codec, Tier
from tests.unit.service.test_controller import MB, admitted


@pytest.fixture
def parts():
    ctl = Guarded(Controller(make_strategy("agentkv")))
    ctl.add_hbm("h", 4 * MB)
    ex = Executor(ctl, {}, {}, {"h": "p"}, LinkCredits(4, 2), landing_pages=0)
    gate = threading.Event()
    # every background thread busy (as when moves wait for a background credit)
    ex._bg.shutdown()
    ex._bg = ThreadPoolExecutor(max_workers=1)
    ex._bg.submit(gate.wait, 10.0)
    yield ctl, ex
    gate.set()
    ex.close()


def _migrating(ctl: Guarded) -> tuple[int, Action]:
    """A page whose gap migration is due (``Controller.due`` marked it so)."""
    admitted(ctl, "a", range(1), 0.0)
    (gid,) = ctl.table.resolve("t", "a", [b"a/0"])
    rec = ctl.manager.table.pages[gid]
    ctl.table.evict(rec, tracked=True)
    rec.busy = True
    return gid, Action(kind=ActionKind.DEMOTE, gid=gid, hbm="h", tier=Tier.HOST,
                       codec=Codec.INT4, reason=Reason.GAP, session=SessionKey("t", "a"))


def test_an_engine_action_runs_while_every_background_thread_is_taken(parts) -> None:
    _ctl, ex = parts
    delete = Action(kind=ActionKind.DELETE, gid=99, hbm="h", tier=Tier.HOST,
                    codec=Codec.FULL, reason=Reason.RETIRE, session=SessionKey("t", "a"), key=b"k",
                    tenant="t", pool="")
    done = threading.Event()
    threading.Thread(target=lambda: (ex.run([delete]), done.set()), daemon=True).start()
    assert done.wait(5.0), "a foreground action queued behind background moves"


def test_a_wanted_background_move_that_has_not_started_gives_way_at_once(parts) -> None:
    ctl, ex = parts
    gid, migration = _migrating(ctl)
    ex.submit([migration])  # queued: the one background thread is taken
    assert not ctl.table.settled([gid])
    assert ex.abandon_queued([gid]) == 1
    rec = ctl.manager.table.pages[gid]
    assert ctl.table.settled([gid]) and rec.resident  # its HBM copy is tracked again
    assert ex.abandon_queued([gid]) == 0  # handed back once
    assert ex.get_finished() == []  # the manager heard it directly, not twice


def test_a_started_background_move_is_not_cancelled(parts) -> None:
    ctl, ex = parts
    gid, migration = _migrating(ctl)
    ex._bg.shutdown(wait=False, cancel_futures=True)
    ex._bg = ThreadPoolExecutor(max_workers=1)
    ex.submit([migration])  # runs at once (and fails: no actor) instead of waiting
    for _ in range(500):
        if not ex._queued:
            break
        threading.Event().wait(0.01)
    assert ex.abandon_queued([gid]) == 0
    ex._bg.shutdown(wait=True)
    (result,) = ex.get_finished()
    assert result.outcome is Outcome.FAILED


class _Actor:
    """Stands in for the HBM actor and the pool: a prefetch that gives way never gets as
    far as moving bytes (one that did would fail here, with no actor behind it)."""

    def add_pool(self, name: str, pool: object) -> None:
        pass


def _prefetching(ctl: Guarded) -> tuple[int, Action]:
    """A page in the pool whose prefetch is due: ``Controller.due`` gave it its HBM room."""
    admitted(ctl, "a", range(1), 0.0)
    (gid,) = ctl.table.resolve("t", "a", [b"a/0"])
    rec = ctl.manager.table.pages[gid]
    ctl.table.evict(rec, tracked=True)
    rec.copies = {Codec.FULL: Tier.HOST}
    ctl.schedule.push(Action(kind=ActionKind.RESTORE, gid=gid, hbm="h", tier=Tier.HOST,
                             codec=Codec.FULL, start_at=1.0, reason=Reason.PREFETCH,
                             session=SessionKey("t", "a")), at=1.0)
    (prefetch,) = ctl.due(1.0)
    assert prefetch.reason is Reason.PREFETCH and rec.resident and rec.busy  # room taken
    return gid, prefetch


def test_a_queued_prefetch_gives_its_room_to_a_load_blocked_on_its_hbm(parts) -> None:
    ctl, ex = parts
    gid, prefetch = _prefetching(ctl)
    ex.submit([prefetch])  # queued: the one background thread is taken
    with ex.room_wanted({"elsewhere"}) as given:
        assert given == 0  # a load blocked on another HBM actor takes nothing from it
    with ex.room_wanted({"h"}) as given:
        assert given == 1
    rec = ctl.manager.table.pages[gid]
    assert not rec.resident and not rec.busy and ctl.manager.table.hbms["h"].used == 0
    assert rec.copies == {Codec.FULL: Tier.HOST}  # the pool copy is where it was
    assert ex.get_finished() == []  # the manager heard it directly


@dataclass
class _Waiting:
    """A prefetch started and waiting for its credit: an engine's restore holds the link."""

    ctl: Guarded
    ex: Executor
    credits: LinkCredits
    gid: int
    deadline: float

    @property
    def link(self) -> Link:
        return Link("p", "h")


@contextmanager
def _prefetch_waiting_for_credit(poll_s: float = LinkCredits.poll_s) -> Iterator[_Waiting]:
    ctl = Guarded(Controller(make_strategy("agentkv")))
    ctl.add_hbm("h", 4 * MB)
    credits = LinkCredits(1, 2)
    credits.poll_s = poll_s
    ex = Executor(ctl, {"h": _Actor()}, {"p": _Actor()}, {"h": "p"}, credits,
                  landing_pages=0)
    try:
        fg = credits.acquire("s", Link("p", "h"))  # the link is busy with an engine's restore
        gid, prefetch = _prefetching(ctl)
        ex.submit([prefetch])
        deadline = time.monotonic() + 5.0
        while ex._queued and time.monotonic() < deadline:  # started: waits for its credit
            time.sleep(0.01)
        time.sleep(0.1)
        yield _Waiting(ctl, ex, credits, gid, deadline)
        credits.release(Link("p", "h"), fg)
    finally:
        ex.close()


def test_a_prefetch_waiting_for_its_credit_gives_its_room_to_a_blocked_load() -> None:
    with _prefetch_waiting_for_credit() as w:
        ctl, ex, gid = w.ctl, w.ex, w.gid
        assert ex.get_finished() == [] and ctl.manager.table.pages[gid].resident
        with ex.room_wanted({"h"}):
            results: list = []
            while not results and time.monotonic() < w.deadline:
                time.sleep(0.01)
                results = ex.get_finished()
        (result,) = results
        assert result.outcome is Outcome.ABANDONED, result.error
        ctl.finished(result, 2.0)  # what the controller actor's loop does with it
        assert not ctl.manager.table.pages[gid].resident
        assert ctl.manager.table.hbms["h"].used == 0


def test_a_prefetch_waiting_for_its_credit_is_promoted_as_soon_as_a_load_wants_it() -> None:
    """The load's ``abandon_queued`` wakes the credit waiters: the prefetch sees that its
    page is wanted at once, not at the next credit poll (made an hour long here)."""
    with _prefetch_waiting_for_credit(poll_s=3600.0) as w:
        assert w.credits.waiting[w.link] == 0  # still a background request
        w.ctl.table.demand.want([w.gid], 1)  # what ``EngineLoader.load`` does first
        assert w.ex.abandon_queued([w.gid]) == 0  # it had started: not handed back, promoted
        while w.credits.waiting[w.link] == 0 and time.monotonic() < w.deadline:
            time.sleep(0.01)
        assert w.credits.waiting[w.link] == 1, "the wanted prefetch slept until the next poll"


@pytest.mark.parametrize("wakes", [True, False])
def test_an_erasure_wakes_its_tenants_moves_waiting_for_a_credit(wakes: bool) -> None:
    """``Guarded.forget_tenant`` wakes the credit waiters once the tenant's moves are
    cancelled: its prefetch waiting for a credit gives up at once and the erasure finds no
    transfer of it in flight. Without the wake (the credit poll made an hour long here)
    the prefetch sleeps on, and the erasure gives up waiting for it (``straggling``)."""
    stop = threading.Event()
    with _prefetch_waiting_for_credit(poll_s=3600.0) as w:

        def controller_loop() -> None:  # what the controller actor's loop does with results
            while not stop.is_set():
                for result in w.ex.get_finished():
                    w.ctl.finished(result, time.monotonic())
                time.sleep(0.005)

        loop = threading.Thread(target=controller_loop, daemon=True)
        loop.start()
        try:
            assert w.ctl.manager.table.tenant_moving("t")
            gone = w.ctl.forget_tenant("t", wait_s=2.0,
                                       wake=w.credits.wake if wakes else lambda: None)
            assert gone.pages == 1
            assert gone.straggling == (0 if wakes else 1)
        finally:
            stop.set()
            loop.join(5.0)


def test_a_prefetch_waiting_for_its_credit_gives_up_when_its_session_closes() -> None:
    """Its page is retired: there is nothing to bring back. It does not count as giving its
    room to a load, and it lands nothing that would then have to be deleted."""
    with _prefetch_waiting_for_credit() as w:
        w.ctl.events.close_session("t", "a", 2.0)
        results: list = []
        while not results and time.monotonic() < w.deadline:
            time.sleep(0.01)
            results = w.ex.get_finished()
        (result,) = results
        assert result.outcome is Outcome.ABANDONED, result.error
        assert w.ex.gave_room == 0
        assert w.ctl.finished(result, 2.1) == []
        assert w.ctl.manager.events.retired_moving == {}
