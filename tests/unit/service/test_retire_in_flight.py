"""A page retired while a move of it is in flight (pure page manager: no Ray, no bytes).

The retirement's deletion runs at once, in the background, while the move still runs: a
demotion then writes its pool copies after the deletion looked for them, and a restore
or an ingest lands an HBM page after the deletion dropped the key. Before, the manager
ignored the end of such a move (the page was gone from its table), so the copies stayed
in the pool and its directory, and the HBM page stayed in the arena, for good. Now the
move's end returns the deletion of what it left, unless a live page holds the same key
again (same key, same bytes: nothing to delete)."""

from __future__ import annotations

import pytest

from agentkv_cluster.runtime import stores
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.guard import Guarded
from agentkv_cluster.runtime.loads import RefusedBusy
from agentkv_cluster.runtime.records import Action, ActionKind, Outcome, Reason, TransferResult
from agentkv_cluster.runtime.strategies import make_strategy
from store.types import Codec, Tier
from tests.unit.service.test_controller import MB, admitted, done, finish, meta


def _full_hbm() -> tuple[Controller, list[Action]]:
    """Session "a" holds pages 1-2 of a 2 MB HBM; session "b" stores two more, so pages
    1-2 are being demoted (their demotions returned, not finished)."""
    ctl = Controller(make_strategy("lru"))
    ctl.add_hbm("h", 2 * MB)
    assert admitted(ctl, "a", range(2), 0.0) == []
    demotions = admitted(ctl, "b", range(2), 1.0)
    assert [a.gid for a in demotions] == [1, 2]
    return ctl, demotions


def test_a_demotion_that_ends_after_the_retirement_deletes_its_pool_copies() -> None:
    ctl, demotions = _full_hbm()
    _, deletions = ctl.events.close_session("t", "a", 2.0)
    assert sorted(a.gid for a in deletions) == [1, 2]
    assert all(a.pool == "" for a in deletions)  # no copy yet: the deletion finds none
    for a in deletions:  # the deletion ran first: its own end leaves nothing to do
        assert ctl.finished(done(a), 2.1) == []
    after = ctl.finished(done(demotions[0], copies=((Tier.HOST, Codec.FULL),),
                              tier_bytes=(MB,), pool="p"), 2.2)
    assert [(a.kind, a.gid, a.pool, a.hbm, a.reason, a.key, a.tenant) for a in after] == [
        (ActionKind.DELETE, 1, "p", "", Reason.RETIRE, b"a/0", "t")]
    failed = TransferResult(action=demotions[1], outcome=Outcome.FAILED, error="x")
    assert ctl.finished(failed, 2.3) == []  # wrote nothing
    assert ctl.events.retired_moving == {}  # nothing remembered for good


def test_a_restore_that_lands_after_the_retirement_drops_its_hbm_page() -> None:
    ctl, demotions = _full_hbm()
    finish(ctl, demotions, 1.5)  # pages 1-2 now live in the pool only
    ctl.events.close_session("t", "b", 1.6)  # room for a restore
    demotes, restores, lost, blocked = ctl.access([1], 2.0)
    assert [a.gid for a in restores] == [1] and not (demotes or lost or blocked)
    _, deletions = ctl.events.close_session("t", "a", 2.1)
    assert {a.gid: (a.hbm, a.pool) for a in deletions} == {1: ("h", "p"), 2: ("h", "p")}
    after = ctl.finished(done(restores[0], source="host"), 2.2)
    assert [(a.kind, a.gid, a.hbm, a.pool) for a in after] == [(ActionKind.DELETE, 1, "h", "")]


def test_an_ingest_that_lands_after_the_retirement_drops_its_hbm_page() -> None:
    ctl = Controller(make_strategy("lru"))
    ctl.add_hbm("h", 4 * MB)
    ctl.table.open_session("t", "a")
    out, _ = ctl.admit("t", "a", [meta("a", 0), meta("a", 1)], 0.0)
    _, deletions = ctl.events.close_session("t", "a", 0.5)  # while the bytes come in
    assert len(deletions) == 2
    after = ctl.ingested([out[0][0]], ok=True) + ctl.ingested([out[1][0]], ok=False)
    assert [(a.kind, a.gid, a.hbm, a.pool) for a in after] == [
        (ActionKind.DELETE, out[0][0], "h", "")]


def test_a_key_is_stored_again_only_once_its_deletion_ran() -> None:
    """A deletion drops by key: a page stored again under it before the deletion ran went
    with it (the page table said resident, the HBM actor held nothing), so the store waits
    for it (the controller actor retries the admission; a lookup stops there)."""
    ctl = Controller(make_strategy("lru"))
    ctl.add_hbm("h", 4 * MB)
    assert admitted(ctl, "a", range(2), 0.0) == []
    _, deletions = ctl.events.close_session("t", "a", 1.0)
    ctl.table.open_session("t", "a")
    out, demotes = ctl.admit("t", "a", [meta("a", 0), meta("a", 2)], 1.1)
    assert out[0] == (0, None) and out[1][1] is True and demotes == []
    state = ctl.table.session("t", "a")
    assert state.pages == {out[1][0]} and (b"a/0", "h") not in ctl.table.by_key  # nothing
    for a in deletions:
        ctl.finished(done(a), 1.2)
    (again, needs), = ctl.admit("t", "a", [meta("a", 0)], 1.3)[0]
    assert needs is True and ctl.table.by_key[(b"a/0", "h")] == again
    assert ctl.events.deletions == {}


def test_a_store_with_no_room_leaves_no_page_behind() -> None:
    """A page admitted while pinned pages fill the HBM stayed in the page table and the
    session, with no bytes anywhere, once its store was refused as busy: a later load of
    it was ``page_lost``, and an event could name it."""
    ctl = Controller(make_strategy("lru"))
    ctl.add_hbm("h", 1 * MB)
    assert admitted(ctl, "a", range(1), 0.0) == []
    ctl.table.pin(ctl.table.pages[1])
    out, demotes = ctl.admit("t", "a", [meta("a", 1)], 1.0)
    assert out == [(2, None)] and demotes == []  # the store retries: kept meanwhile
    ctl.events.forget_unstored("t", "a", [2])  # refused as busy in the end
    assert list(ctl.table.pages) == [1] and ctl.table.session("t", "a").pages == {1}
    assert ctl.table.by_pid.get(("t", "a", 1)) is None and len(ctl.table.by_pid) == 1


def test_nothing_goes_that_a_live_page_holds_under_the_same_key() -> None:
    ctl, demotions = _full_hbm()
    _, deletions = ctl.events.close_session("t", "a", 2.0)
    for a in deletions:  # the close's own deletions ran: the keys may be stored again
        ctl.finished(done(a), 2.05)
    admitted(ctl, "a", range(1), 2.1)  # page a/0 stored again: live under its key
    assert (b"a/0", "h") in ctl.table.by_key
    after = ctl.finished(done(demotions[0], copies=((Tier.HOST, Codec.FULL),),
                              tier_bytes=(MB,), pool="p"), 2.2)
    assert after == []
    # Page a/1 is not stored again: its copies go.
    after = ctl.finished(done(demotions[1], copies=((Tier.HOST, Codec.FULL),),
                              tier_bytes=(MB,), pool="p"), 2.3)
    assert [(a.gid, a.pool) for a in after] == [(2, "p")]


class _NoMoves:
    def run(self, actions: list[Action]) -> list[TransferResult]:
        assert actions == []
        return []


def test_a_store_whose_key_stays_in_deletion_is_refused_as_busy_for_that_reason(
        monkeypatch) -> None:
    """A deletion that never reports (a transfer worker that stopped) keeps a store of its
    key waiting until ``STORE_WAIT_S``; the refusal says so (it said the HBM was full of
    pinned pages, with the HBM empty) and the session keeps nothing of the store."""
    monkeypatch.setattr(stores, "STORE_WAIT_S", 0.05)
    ctl = Controller(make_strategy("lru"))
    ctl.add_hbm("h", 4 * MB)
    assert admitted(ctl, "a", range(2), 0.0) == []
    ctl.events.close_session("t", "a", 1.0)  # its deletions never finish
    ctl.table.open_session("t", "a")
    storer = stores.EngineStorer(Guarded(ctl), _NoMoves(), {}, lambda _: False, print)
    with pytest.raises(RefusedBusy, match="still being deleted"):
        storer.store("t", "a", [meta("a", 0)], [None])
    assert ctl.table.session("t", "a").pages == set() and ctl.table.hbm_used() == {"h": 0}
