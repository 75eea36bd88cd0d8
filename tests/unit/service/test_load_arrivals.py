"""A load pins pages already on their way into HBM (a prefetch in flight) as they are and
runs its own restores alongside, waiting for those arrivals only at the end; a failed
arrival is restored by the load itself (pure: no Ray; the worker below moves no bytes)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from agentkv_cluster.api.errors import NoRoom, PageLost
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.guard import Guarded, StillMoving
from agentkv_cluster.runtime.loads import EngineLoader, RefusedPageLost
from agentkv_cluster.runtime.records import (
    Action,
    ActionKind,
    Outcome,
    Reason,
    RefusedNotFound,
    TransferResult,
)
from agentkv_cluster.runtime.refusal_codes import as_api_error
from agentkv_cluster.runtime.strategies import make_strategy
from store.types import Codec, Tier
from tests.unit.service.test_controller import MB, admitted, done, meta
from tests.unit.service.test_page_lost import _one_page_in_the_pool


class _Worker:
    """The transfer worker's contract as the loader uses it: ``run`` reports every action
    to the manager before it returns."""

    def __init__(self, ctl: Guarded) -> None:
        self.ctl, self.ran, self.ran_at = ctl, [], []

    def abandon_queued(self, gids: list[int]) -> int:
        return 0

    def run(self, actions: list[Action]) -> list[TransferResult]:
        results = [done(a, source="host") if a.kind is ActionKind.RESTORE else
                   done(a, copies=((a.tier, a.codec),), tier_bytes=(MB,), pool="p")
                   for a in actions]
        for r in results:
            self.ctl.finished(r, time.monotonic())
        self.ran += [a.gid for a in actions if a.kind is ActionKind.RESTORE]
        self.ran_at.append(time.monotonic())
        return results


def _prefetching() -> tuple[Guarded, list[int], Action]:
    """Two pages pushed out to the host; the first one's prefetch has started."""
    ctl = Guarded(Controller(make_strategy("agentkv")))
    ctl.add_hbm("h", 8 * MB)
    admitted(ctl, "a", range(2), 0.0)
    gids = ctl.table.resolve("t", "a", [b"a/0", b"a/1"])
    for g in gids:
        rec = ctl.manager.table.pages[g]
        ctl.manager.table.evict(rec, tracked=True)
        rec.copies, rec.pool = {Codec.FULL: Tier.HOST}, "p"
    prefetch = Action(kind=ActionKind.RESTORE, gid=gids[0], hbm="h", tier=Tier.HOST,
                      codec=Codec.FULL, start_at=1.0, reason=Reason.PREFETCH, session="a")
    ctl.schedule.push(prefetch, at=1.0)
    (started,) = ctl.due(1.0)
    assert started.kind is ActionKind.RESTORE and ctl.manager.table.pages[gids[0]].arriving
    return ctl, gids, started


def _finish_later(ctl: Guarded, action: Action, after_s: float, ok: bool = True
                  ) -> threading.Thread:
    def end() -> None:
        time.sleep(after_s)
        outcome = Outcome.DONE if ok else Outcome.FAILED
        ctl.finished(TransferResult(action=action, outcome=outcome, source="host",
                                    elapsed_s=after_s), time.monotonic())
    t = threading.Thread(target=end, daemon=True)
    t.start()
    return t


def test_an_arriving_page_is_settled_pinned_as_it_is_and_not_restored_again() -> None:
    ctl, (g0, g1), _prefetch = _prefetching()
    assert ctl.table.settled([g0, g1]) and not ctl.table.arrived([g0, g1])
    _demotes, restores, lost, blocked = ctl.access([g0, g1], 1.1)
    assert [r.gid for r in restores] == [g1] and (lost, blocked) == ([], [])
    assert ctl.manager.table.pages[g0].pins == 1  # pinned while its bytes arrive


def test_a_load_restores_its_other_pages_while_a_prefetch_is_in_flight() -> None:
    ctl, (g0, g1), prefetch = _prefetching()
    worker = _Worker(ctl)
    loader = EngineLoader(ctl, worker, check=lambda results: None)
    t0 = time.monotonic()
    finisher = _finish_later(ctl, prefetch, 0.3)
    reports = loader.load("t", "a", [b"a/0", b"a/1"])
    finisher.join()
    assert worker.ran == [g1] and worker.ran_at[0] - t0 < 0.25  # not after the prefetch
    assert time.monotonic() - t0 >= 0.3  # the load returned once the prefetch landed
    by_key = {r.key: r for r in reports}
    # it waited for the arrival (0.3 s after the finisher started, a moment before the load)
    assert by_key[b"a/0"].source == "hbm" and by_key[b"a/0"].delay_s >= 0.25
    # hidden: only the prefetch's time before the load began (the finisher started a moment
    # earlier); the engine waited for all the rest
    report = by_key[b"a/0"]
    assert report.hidden_s == pytest.approx(max(0.0, 0.3 - report.delay_s))
    assert report.hidden_s < 0.05
    assert all(ctl.manager.table.pages[g].resident for g in (g0, g1))
    (phases,) = loader.phases  # where the time went: the arrival, not a wait to settle
    assert phases.settle_s < 0.25 <= phases.arrival_s and phases.blocked_s == 0.0
    assert (phases.pages, phases.restored) == (2, 1) and phases.total_s >= phases.arrival_s


def test_a_failed_arrival_is_restored_by_the_load_itself() -> None:
    ctl, (g0, g1), prefetch = _prefetching()
    worker = _Worker(ctl)
    loader = EngineLoader(ctl, worker, check=lambda results: None)
    finisher = _finish_later(ctl, prefetch, 0.1, ok=False)
    loader.load("t", "a", [b"a/0", b"a/1"])
    finisher.join()
    assert sorted(worker.ran) == [g0, g1]  # g1 alongside, g0 once its prefetch failed
    pages = ctl.manager.table.pages
    assert all(pages[g].resident and pages[g].pins == 1 for g in (g0, g1))


def test_arrivals_that_keep_failing_past_the_deadline_are_page_lost_not_bad_input() -> None:
    ctl, (g0, g1), prefetch = _prefetching()
    loader = EngineLoader(ctl, _Worker(ctl), check=lambda results: None)
    loader.deadline_s = 0.0  # the load's own restores ran; the prefetch fails after it
    finisher = _finish_later(ctl, prefetch, 0.1, ok=False)
    with pytest.raises(RefusedPageLost, match="1 page\\(s\\) did not arrive"):
        loader.load("t", "a", [b"a/0", b"a/1"])
    finisher.join()
    assert all(ctl.manager.table.pages[g].pins == 0 for g in (g0, g1))  # nothing held
    assert isinstance(as_api_error(RefusedPageLost("x")), PageLost)


def test_a_failed_restore_leaves_the_other_loads_pins_counted() -> None:
    """Load A restores a page, load B pins it while it arrives; A's restore fails. The
    failure zeroed every pin of the page, so A's own unpin afterwards (or after B pinned
    it again) took B's pin: B then held a page with no pin, evictable under its engine
    (found by review)."""
    ctl, gid = _one_page_in_the_pool()
    rec = ctl.manager.table.pages[gid]
    _demotes, (restore,), _lost, _blocked = ctl.access([gid], 1.0)  # load A
    _demotes, restores, _lost, _blocked = ctl.access([gid], 1.1)  # load B: pinned, arriving
    assert restores == [] and rec.pins == 2
    ctl.finished(TransferResult(action=restore, outcome=Outcome.FAILED, error="x"), 1.2)
    assert not rec.resident
    ctl.table.unpin([gid], 1.3)  # A gives up its pin
    assert rec.pins == 1  # B's is still counted
    ctl.table.unpin([gid], 1.4)  # B restores it itself: it unpins first, then pins again
    assert rec.pins == 0 and not rec.view.pinned


def test_a_page_dropped_right_after_the_arrival_wait_leaves_no_pin_on_the_others() -> None:
    """Between the arrival wait and the check of what arrived, closing the session dropped
    one of the load's pages: the KeyError ended the load with its pin left on the page
    another session keeps (in no session's pins, so never expired: pinned for good)."""
    ctl, (g0, g1), prefetch = _prefetching()
    loader = EngineLoader(ctl, _Worker(ctl), check=lambda results: None)
    real_wait = ctl.wait_arrived

    def wait_then_close(gids, timeout_s):
        real_wait(gids, timeout_s)
        ctl.table.open_session("t", "b")  # b stores a/1 too: it stays when a closes
        ctl.admit("t", "b", [replace(meta("a", 1), session="b")], 2.0)
        ctl.events.close_session("t", "a", 2.0)  # a/0 retired, a/1 kept for b

    ctl.wait_arrived = wait_then_close
    finisher = _finish_later(ctl, prefetch, 0.1)
    with pytest.raises(RefusedNotFound):
        loader.load("t", "a", [b"a/0", b"a/1"])
    finisher.join()
    assert g0 not in ctl.manager.table.pages
    assert ctl.manager.table.pages[g1].pins == 0


def test_a_page_still_moving_out_after_the_wait_is_busy_not_lost(monkeypatch) -> None:
    """A demotion dropping a page's HBM copy that outlasts the load's wait: the load used
    to go on as if it had settled, found no copy yet and refused the page as lost
    (``page_lost``: the engine recomputes a page that is only slow). It is busy: retry."""
    monkeypatch.setattr("agentkv_cluster.runtime.guard.LOAD_WAIT_S", 0.1)
    ctl = Guarded(Controller(make_strategy("lru")))
    ctl.add_hbm("h", 8 * MB)
    admitted(ctl, "a", range(1), 0.0)
    (gid,) = ctl.table.resolve("t", "a", [b"a/0"])
    rec = ctl.manager.table.pages[gid]
    ctl.manager.table.evict(rec, tracked=True)  # its demotion dropped the HBM copy ...
    ctl.manager.table.set_busy(rec, True)  # ... and has not reported its pool copy yet
    assert rec.moving_out and not rec.copies
    loader = EngineLoader(ctl, _Worker(ctl), check=lambda results: None)
    with pytest.raises(StillMoving, match="still being moved out of HBM") as caught:
        loader.load("t", "a", [b"a/0"])
    assert isinstance(as_api_error(caught.value), NoRoom)  # busy, never page_lost
    assert rec.pins == 0 and loader.recompute_tokens == {}


def test_a_page_still_arriving_after_the_wait_is_busy_not_served(monkeypatch) -> None:
    """A prefetch that outlasts the arrival wait: its page is resident in the table (its
    slot is taken) but its bytes are not in HBM yet. The load used to take it as arrived
    and report it served from HBM. It is refused as busy, with no pin left."""
    monkeypatch.setattr("agentkv_cluster.runtime.loads.LOAD_WAIT_S", 0.1)
    ctl, (g0, g1), _prefetch = _prefetching()  # the prefetch never ends
    loader = EngineLoader(ctl, _Worker(ctl), check=lambda results: None)
    with pytest.raises(StillMoving, match="still on its way into HBM") as caught:
        loader.load("t", "a", [b"a/0", b"a/1"])
    assert isinstance(as_api_error(caught.value), NoRoom)
    assert all(ctl.manager.table.pages[g].pins == 0 for g in (g0, g1))
    assert ctl.manager.table.pages[g0].arriving  # still on its way: nothing undone
