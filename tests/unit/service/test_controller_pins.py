"""Pins and the HBM budget under several tenants (pure: no Ray, no bytes): the budget
counts whole arena pages, a session's pins never stack, and pins end on release, task
end, timeout, or when a tenant within its share needs the room."""

from __future__ import annotations

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.records import PageMeta
from agentkv_cluster.runtime.strategies import make_strategy
from tests.unit.service.test_controller import done

PAGE = 1 << 20


def _meta(tenant: str, session: str, pid: int, length: int = PAGE) -> PageMeta:
    return PageMeta(key=f"{tenant}/{session}/{pid}".encode(), digest=b"d" * 32, tenant=tenant,
                    namespace=tenant, session=session, page_id=pid,
                    state_type=StateType.EVIDENCE, length=length, tokens=16)


def _store(ctl: Controller, tenant: str, session: str, pids: range, length: int = PAGE
           ) -> list[int]:
    ctl.table.open_session(tenant, session)
    out, actions = ctl.admit(tenant, session, [_meta(tenant, session, p, length)
                                               for p in pids], 0.0)
    for a in actions:  # the demotions made room: they completed
        ctl.finished(done(a, copies=((a.tier, a.codec),), tier_bytes=(length,), pool="p"), 0.0)
    ctl.ingested([g for g, _ in out])
    return [g for g, _ in out]


def _controller(pages: int = 4) -> Controller:
    ctl = Controller(make_strategy("lru"), page_bytes=PAGE)
    ctl.add_hbm("h", pages * PAGE)
    return ctl


def test_tiny_pages_are_charged_a_whole_arena_page() -> None:
    ctl = _controller(4)
    _store(ctl, "greedy", "s", range(4), length=1)  # four 1-byte pages fill 4 arena pages
    assert ctl.table.hbms["h"].used == 4 * PAGE
    ctl.table.open_session("fair", "f")
    out, demotes = ctl.admit("fair", "f", [_meta("fair", "f", 0)], 0.0)
    assert out[0][1] is True and len(demotes) == 1  # one tiny page makes room


def test_repeated_loads_hold_one_pin_and_one_release_ends_it() -> None:
    ctl = _controller()
    gids = _store(ctl, "t", "s", range(2))
    for _ in range(3):
        ctl.access(gids, 1.0)
        ctl.table.hold("t", "s", gids, 1.0)
    assert [ctl.table.pages[g].pins for g in gids] == [1, 1]
    assert ctl.table.release_held("t", "s", gids, 2.0) == 2
    assert [ctl.table.pages[g].pins for g in gids] == [0, 0]
    assert ctl.table.release_held("t", "s", gids, 2.0) == 0  # never below zero, nor others' pins


def test_pins_end_with_the_task_and_after_the_timeout() -> None:
    ctl = _controller()
    gids = _store(ctl, "t", "s", range(2))
    ctl.access(gids[:1], 1.0)
    ctl.table.hold("t", "s", gids[:1], 1.0)
    ctl.access(gids[1:], 20.0)
    ctl.table.hold("t", "s", gids[1:], 20.0)
    assert ctl.table.expire_held(30.0, ttl_s=15.0) == 1  # only the older one
    assert [ctl.table.pages[g].pins for g in gids] == [0, 1]
    assert ctl.table.release_held("t", "s", None, 31.0) == 1  # the task ended
    assert ctl.table.pages[gids[1]].pins == 0


def test_pins_above_a_tenants_share_give_way_to_a_tenant_within_its_share() -> None:
    ctl = _controller(4)
    greedy = _store(ctl, "greedy", "s", range(4))
    ctl.access(greedy, 1.0)  # pins the whole HBM
    ctl.table.hold("greedy", "s", greedy, 1.0)
    ctl.table.open_session("fair", "f")
    out, demotes = ctl.admit("fair", "f", [_meta("fair", "f", 0)], 2.0)
    assert out[0][1] is True and len(demotes) == 1  # admitted at once, not refused
    # oldest pins revoked down to its share
    assert sum(ctl.table.pages[g].pins for g in greedy) == 2
    # the greedy tenant cannot revoke the fair one's pins: it is above its share itself
    fair = [g for g, _ in out]
    ctl.ingested(fair)
    ctl.access(fair, 3.0)
    ctl.table.hold("fair", "f", fair, 3.0)
    assert ctl.table.revoke_pins("h", "greedy", 4.0) == 0 and ctl.table.pages[fair[0]].pins == 1
