"""Tool return as a signal: a returned session's pages are wanted before its engine asks,
and a gap migration that finishes after the return keeps its HBM copy; a load takes
back a page whose gap migration is still copying it out (pure: no Ray)."""

from __future__ import annotations

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.records import Action, ActionKind, Reason
from agentkv_cluster.runtime.strategies import make_strategy
from store.types import Codec, Tier
from tests.unit.service.test_controller import MB, admitted, done, finish


def _event(ctl: Controller, version: int, now: float, **data: object) -> None:
    event = ctl.events.translate("t", "a", {"event_id": version, "task_id": "x",
                                            "version": version, "ts": now, **data})
    ctl.apply(event, now)


def _session(capacity: int = 8 * MB) -> tuple[Controller, list[int]]:
    ctl = Controller(make_strategy("agentkv"))
    ctl.add_hbm("h", capacity)
    admitted(ctl, "a", range(2), 0.0)
    gids = ctl.table.resolve("t", "a", [b"a/0", b"a/1"])
    _event(ctl, 1, 0.1, kind="task_start", prefix_generation=1, prefix_pages=[0],
           input_pages=[1])
    _event(ctl, 2, 0.2, kind="tool_start", call_id="k1", tool="grep")
    return ctl, gids


def test_a_returned_tool_marks_its_session_pages_wanted_until_the_engine_loads() -> None:
    ctl, gids = _session()
    assert not any(ctl.table.demand.wanted(g) for g in gids)
    _event(ctl, 3, 1.0, kind="observation_return", call_id="k1")
    assert all(ctl.table.demand.wanted(g) for g in gids)  # background moves of them give way now
    ctl.access(gids, 1.1)
    assert not any(ctl.table.demand.wanted(g) for g in gids)


def test_the_next_tool_start_clears_the_mark_when_no_load_came() -> None:
    ctl, gids = _session()
    _event(ctl, 3, 1.0, kind="observation_return", call_id="k1")
    _event(ctl, 4, 1.5, kind="tool_start", call_id="k2", tool="grep")
    assert not any(ctl.table.demand.wanted(g) for g in gids)


def test_a_gap_migration_keeps_the_hbm_copy_while_its_room_is_still_free() -> None:
    ctl, (g0, g1) = _session()
    for g in (g0, g1):  # both are moving out for the tool gap
        ctl.table.evict(ctl.table.pages[g], tracked=True)
        ctl.table.pages[g].busy = True
    used = ctl.table.hbms["h"].used
    assert ctl.keep_if_room(g0, 0.5)  # nothing needed the room during the copy
    assert ctl.table.pages[g0].resident and ctl.table.hbms["h"].used == used + MB
    ctl.table.hbms["h"].used = ctl.table.hbms["h"].capacity  # another session took the rest
    assert not ctl.keep_if_room(g1, 0.6)  # its room went to someone: the copy is dropped
    assert not ctl.table.pages[g1].resident
    assert ctl.keep_if_room(g0, 1.0)  # resident: the copy stays, never dropped under it
    assert ctl.stats["kept_in_hbm"] == 1


def test_a_kept_page_is_no_victim_until_its_demotion_has_ended() -> None:
    """Between ``keep_if_room`` and the demotion's result the page is resident again but
    still moving: a second demotion then would copy it again, and the first one's result
    would clear the busy flag an erasure waits on while the second still runs."""
    ctl, (g0, g1) = _session(capacity=2 * MB)
    migration = _migrating(ctl, g0, 0.5)
    ctl.access([g1], 0.55)  # pinned: g0 is the one page pressure could take
    assert ctl.keep_if_room(g0, 0.6)
    policy = ctl.table.hbms["h"].policy
    assert policy.select_victims(MB, 0.65) == []
    assert admitted(ctl, "c", range(1), 0.7) == []  # no room: g0 is not demoted again
    assert ctl.table.pages[g0].resident and ctl.stats["demotes"] == 1
    ctl.finished(done(migration, copies=((Tier.HOST, Codec.INT4),), tier_bytes=(MB // 4,),
                      pool="p"), 0.8)
    assert policy.select_victims(MB, 0.9) == [g0]  # ended: a victim like any other


def test_a_kept_page_is_clean_a_pressure_demotion_reuses_its_clean_copy() -> None:
    ctl, (g0, g1) = _session(capacity=2 * MB)
    migration = _migrating(ctl, g0, 0.5)
    assert ctl.keep_if_room(g0, 0.6)
    ctl.finished(done(migration, copies=((Tier.HOST, Codec.INT4),), tier_bytes=(MB // 4,),
                      pool="p"), 0.7)
    rec = ctl.table.pages[g0]
    assert rec.resident and not rec.busy and rec.clean_copy is Codec.INT4
    ctl.access([g1], 0.8)  # pinned: g0 is the one page pressure can take
    demotes = admitted(ctl, "c", range(1), 1.0)  # pressure: session a's page gives way
    assert [(a.gid, a.tier, a.codec, a.reason) for a in demotes] == [
        (g0, Tier.HOST, Codec.INT4, Reason.PRESSURE)]  # the copy it has: nothing to move
    rec.clean_copy = Codec.INT4
    ctl.access([g0], 2.0)  # read again (restored): its next demotion is decided afresh
    assert rec.clean_copy is None


def test_a_pressure_victim_of_a_session_in_a_tool_is_prefetched_before_its_return() -> None:
    ctl, (g0, g1) = _session(capacity=2 * MB)  # session a: in a tool, both pages resident
    (_t, _started, plan) = ctl.table.sessions[("t", "a")].tools["k1"]
    assert plan is not None
    admitted(ctl, "b", range(1), 0.3)  # a new page needs room: one of a's pages goes
    demoted = [g for g in (g0, g1) if not ctl.table.pages[g].resident]
    assert len(demoted) == 1
    scheduled = [(at, a) for at, a in ctl.schedule if a.gid == demoted[0]]
    assert [a.reason for _at, a in scheduled] == [Reason.REFILL]
    assert 0.3 <= scheduled[0][0] <= plan.predicted_return  # back before the tool returns


def test_lru_schedules_no_prefetch_for_its_victims() -> None:
    ctl = Controller(make_strategy("lru"))
    ctl.add_hbm("h", 2 * MB)
    admitted(ctl, "a", range(2), 0.0)
    _event(ctl, 1, 0.1, kind="task_start", prefix_generation=1, prefix_pages=[0],
           input_pages=[1])
    _event(ctl, 2, 0.2, kind="tool_start", call_id="k1", tool="grep")
    admitted(ctl, "b", range(1), 0.3)
    assert not [a for _at, a in ctl.schedule if a.kind.value == "restore"]


def test_room_for_one_load_spares_the_pages_another_load_waits_for() -> None:
    """LRU order would evict a/0 (the oldest); a load waits for it, so a/1 goes instead.
    Without the sparing the waiting load finds its page being demoted, waits for that,
    then restores it again."""
    ctl = Controller(make_strategy("lru"))
    ctl.add_hbm("h", 3 * MB)
    finish(ctl, admitted(ctl, "a", range(2), 0.0), 0.0)
    finish(ctl, admitted(ctl, "b", range(1), 1.0), 1.0)
    a0, a1 = ctl.table.resolve("t", "a", [b"a/0", b"a/1"])
    ctl.table.demand.want([a0], 1)
    demotes = admitted(ctl, "c", range(1), 2.0)
    assert [a.gid for a in demotes] == [a1]
    finish(ctl, demotes, 2.0)
    ctl.table.demand.want([a0], -1)
    # a session whose tool returned is about to load: its pages are spared the same way
    (b0,) = ctl.table.resolve("t", "b", [b"b/0"])
    _event(ctl, 1, 2.5, kind="task_start", prefix_generation=1, prefix_pages=[0],
           input_pages=[1])
    _event(ctl, 2, 2.6, kind="tool_start", call_id="k1", tool="grep")
    _event(ctl, 3, 2.7, kind="observation_return", call_id="k1")
    assert ctl.table.demand.wanted(a0)
    demotes = admitted(ctl, "d", range(1), 3.0)
    assert [a.gid for a in demotes] == [b0]
    finish(ctl, demotes, 3.0)


def test_sparing_never_blocks_a_load_when_only_spared_pages_can_make_room() -> None:
    ctl = Controller(make_strategy("lru"))
    ctl.add_hbm("h", 2 * MB)
    finish(ctl, admitted(ctl, "a", range(2), 0.0), 0.0)
    a0, a1 = ctl.table.resolve("t", "a", [b"a/0", b"a/1"])
    ctl.table.demand.want([a0, a1], 1)
    demotes = admitted(ctl, "c", range(1), 1.0)
    assert [a.gid for a in demotes] == [a0]  # the policy's own order once nothing else fits


def _migrating(ctl: Controller, gid: int, at: float) -> Action:
    """``gid``'s gap migration, started by ``due`` (its HBM copy stays until decided)."""
    action = Action(kind=ActionKind.DEMOTE, gid=gid, hbm="h", tier=Tier.HOST,
                    codec=Codec.INT4, start_at=at, reason=Reason.GAP, session="a")
    ctl.schedule.push(action, at=at)
    assert ctl.due(at) == [action]
    return action


def test_a_load_takes_back_a_page_its_gap_migration_is_still_copying_out() -> None:
    ctl, (g0, g1) = _session()
    migration = _migrating(ctl, g0, 0.5)
    rec = ctl.table.pages[g0]
    assert rec.busy and not rec.resident
    assert ctl.table.settled([g0, g1])  # no wait: its bytes are still in HBM
    demotes, restores, lost, blocked = ctl.access([g0, g1], 1.0)
    assert (demotes, restores, lost, blocked) == ([], [], [], [])  # nothing moves in
    assert rec.resident and rec.pins == 1
    assert ctl.keep_if_room(g0, 1.1)  # the worker must not drop the copy under the load
    ctl.finished(done(migration, copies=((Tier.HOST, Codec.INT4),), tier_bytes=(MB // 4,),
                      pool="p"), 1.2)
    assert rec.resident and not rec.busy and rec.copies == {Codec.INT4: Tier.HOST}


def test_once_the_worker_decided_to_drop_a_load_waits_then_restores() -> None:
    ctl, (g0, _g1) = _session()
    migration = _migrating(ctl, g0, 0.5)
    ctl.table.hbms["h"].used = ctl.table.hbms["h"].capacity  # its room was taken meanwhile
    assert not ctl.keep_if_room(g0, 0.6)  # so the copy is dropped now
    ctl.table.hbms["h"].used -= MB  # (the page that took it left again)
    assert not ctl.table.settled([g0])  # a load must wait for the drop ...
    ctl.finished(done(migration, copies=((Tier.HOST, Codec.INT4),), tier_bytes=(MB // 4,),
                      pool="p"), 0.7)
    _demotes, restores, _lost, _blocked = ctl.access([g0], 1.0)  # ... and restore it
    assert [(r.gid, r.codec) for r in restores] == [(g0, Codec.INT4)]


def test_a_load_takes_back_its_page_while_a_pressure_demotion_copies_it_out() -> None:
    """Another load's room-making picked a/0 and is copying it out; its HBM copy stays
    until the worker decides. A load of a/0 now takes it back: it neither waits for the
    copy nor restores the page, and makes room for it instead."""
    ctl = Controller(make_strategy("lru"))
    ctl.add_hbm("h", 2 * MB)
    finish(ctl, admitted(ctl, "a", range(2), 0.0), 0.0)
    a0, a1 = ctl.table.resolve("t", "a", [b"a/0", b"a/1"])
    (pressure,) = admitted(ctl, "b", range(1), 1.0)  # LRU: the oldest page gives way
    rec = ctl.table.pages[a0]
    assert (pressure.gid, pressure.reason) == (a0, Reason.PRESSURE)
    assert rec.leaving and not rec.resident and not rec.moving_out
    assert ctl.table.settled([a0])  # no wait: its bytes are still in HBM
    demotes, restores, lost, blocked = ctl.access([a0], 2.0)
    assert (restores, lost, blocked) == ([], [], [])  # nothing moves in
    assert [d.gid for d in demotes] == [a1]  # its room comes from another page
    assert rec.resident and rec.pins == 1 and ctl.stats["taken_back"] == 1
    assert ctl.table.hbms["h"].used <= 2 * MB
    assert ctl.keep_if_room(a0, 2.1)  # the worker must not drop the copy under the load
    ctl.finished(done(pressure, copies=((Tier.HOST, Codec.FULL),), tier_bytes=(MB,),
                      pool="p"), 2.2)
    assert rec.resident and not rec.busy and rec.clean_copy is Codec.FULL


def test_a_pressure_victim_nobody_took_back_is_dropped_and_restored_when_read() -> None:
    ctl = Controller(make_strategy("lru"))
    ctl.add_hbm("h", 2 * MB)
    finish(ctl, admitted(ctl, "a", range(2), 0.0), 0.0)
    (a0,) = ctl.table.resolve("t", "a", [b"a/0"])
    (pressure,) = admitted(ctl, "b", range(1), 1.0)
    assert not ctl.keep_if_room(a0, 1.1)  # its room went to b/0: the copy is dropped
    assert not ctl.table.settled([a0])  # a load now waits for the drop ...
    ctl.finished(done(pressure, copies=((Tier.HOST, Codec.FULL),), tier_bytes=(MB,),
                      pool="p"), 1.2)
    _demotes, restores, _lost, _blocked = ctl.access([a0], 2.0)  # ... then restores it
    assert [r.gid for r in restores] == [a0]
    assert ctl.table.pages[a0].clean_copy is None
