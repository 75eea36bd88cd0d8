"""The transfer worker copies a demoted page out with its HBM copy in place and asks the
manager only afterwards whether to drop it: a load that took the page back meanwhile
keeps it. Each result reaches the manager when its own transfer ends (pure: no Ray; the
HBM actor below records its calls and moves no bytes)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.executor import Executor
from agentkv_cluster.runtime.guard import Guarded
from agentkv_cluster.runtime.link_credits import LinkCredits
from agentkv_cluster.runtime.records import (
    ActionKind,
    DemoteReceipt,
    Outcome,
    PageMeta,
    Reason,
    RestoreReceipt,
)
from agentkv_cluster.runtime.strategies import make_strategy
from store.types import Codec, Tier
from tests.unit.service.test_controller import MB, admitted, finish


class _Hbm:
    """An HBM actor's demote and drop, recorded; ``during`` runs inside the copy."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.during: Callable[[PageMeta], None] = lambda meta: None
        self.dropping: Callable[[bytes], None] = lambda key: None

    def add_pool(self, name: str, pool: object) -> None:
        pass

    def demote(self, meta: PageMeta, targets: list, pool: str, drop: bool) -> DemoteReceipt:
        self.calls.append(("demote", drop))
        self.during(meta)
        return DemoteReceipt(copies=tuple(targets), tier_bytes=(MB,) * len(targets),
                             link_bytes=MB, pool=pool)

    def drop(self, key: bytes, scrub: bool = False) -> bool:
        self.calls.append(("drop", key))
        self.dropping(key)
        return True

    def reserve(self, n: int, owner: str) -> list:
        return []  # no landing pages: restores take the two-hop path

    def restore(self, meta: PageMeta, tier: int, codec: int, pool: str) -> RestoreReceipt:
        self.calls.append(("restore", meta.key))
        return RestoreReceipt(tier=tier, codec=codec, link_bytes=MB, exact=True)


def _worker() -> tuple[Guarded, Executor, _Hbm]:
    """An LRU manager with a 2-page HBM budget full of session a's two pages, and a worker
    over the recording HBM actor."""
    ctl = Guarded(Controller(make_strategy("lru")))
    ctl.add_hbm("h", 2 * MB)
    hbm = _Hbm()
    ex = Executor(ctl, {"h": hbm}, {"p": object()}, {"h": "p"}, LinkCredits(4, 2),
                  landing_pages=0)
    finish(ctl.manager, admitted(ctl.manager, "a", range(2), 0.0), 0.0)
    return ctl, ex, hbm


@pytest.fixture
def parts():
    ctl, ex, hbm = _worker()
    (pressure,) = admitted(ctl.manager, "b", range(1), 1.0)  # LRU: a/0 gives way
    assert (pressure.kind, pressure.reason) == (ActionKind.DEMOTE, Reason.PRESSURE)
    yield ctl, ex, hbm, pressure
    ex.close()


def test_a_page_taken_back_during_its_copy_out_keeps_its_hbm_copy(parts) -> None:
    ctl, ex, hbm, pressure = parts
    rec = ctl.manager.table.pages[pressure.gid]
    taken: list = []
    hbm.during = lambda _meta: taken.append(ctl.access([pressure.gid], 2.0))  # wanted
    (result,) = ex.run([pressure])
    assert result.outcome is Outcome.DONE
    assert hbm.calls == [("demote", False)]  # copied out, never dropped
    assert taken[0][1] == []  # the load restored nothing
    assert rec.resident and not rec.busy and rec.copies == {Codec.FULL: Tier.HOST}


def test_a_page_nobody_took_back_is_dropped_after_its_copy_out(parts) -> None:
    ctl, ex, hbm, pressure = parts
    (result,) = ex.run([pressure])
    assert result.outcome is Outcome.DONE
    key = ctl.manager.table.pages[pressure.gid].meta.key
    assert hbm.calls == [("demote", False), ("drop", key)]
    assert not ctl.manager.table.pages[pressure.gid].resident


def test_each_result_reaches_the_manager_when_its_own_transfer_ends() -> None:
    """Two victims of one batch: while the first is still being copied out, the second's
    demotion has already been applied (a load waiting for that page waits for it alone,
    not for the whole batch)."""
    ctl, ex, hbm = _worker()
    first, second = admitted(ctl.manager, "b", range(2), 1.0)
    other = ctl.manager.table.pages[second.gid]
    seen: list[bool] = []

    def copying(meta: PageMeta) -> None:
        if meta.key == ctl.manager.table.pages[first.gid].meta.key:
            deadline = time.monotonic() + 2.0
            while other.busy and time.monotonic() < deadline:
                time.sleep(0.005)
            seen.append(not other.busy)

    hbm.during = copying
    try:
        results = ex.run([first, second])
    finally:
        ex.close()
    assert [r.outcome for r in results] == [Outcome.DONE, Outcome.DONE]
    assert seen == [True]


def test_a_restore_does_not_wait_for_its_victims_drop() -> None:
    """The restore goes on once its victim is copied out and the drop decided: the drop
    only frees an arena page, which an allocation waits for anyway."""
    ctl, ex, hbm = _worker()
    finish(ctl.manager, admitted(ctl.manager, "c", range(1), 1.0), 1.0)  # a/0 pushed out
    (a0,) = ctl.table.resolve("t", "a", [b"a/0"])
    demotes, restores, _lost, _blocked = ctl.access([a0], 2.0)
    assert [r.gid for r in restores] == [a0] and len(demotes) == 1
    restored_first: list[bool] = []

    def slow_drop(key: bytes) -> None:
        deadline = time.monotonic() + 2.0
        while ("restore", ctl.manager.table.pages[a0].meta.key) not in hbm.calls \
                and time.monotonic() < deadline:
            time.sleep(0.005)
        restored_first.append(time.monotonic() < deadline)

    hbm.dropping = slow_drop
    try:
        results = ex.run(demotes + restores)
    finally:
        ex.close()
    assert [r.outcome for r in results] == [Outcome.DONE, Outcome.DONE]
    assert restored_first == [True]
    assert [c[0] for c in hbm.calls] == ["demote", "drop", "restore"]  # the drop's start


def test_a_lossy_working_copy_left_with_no_pool_copy_is_demoted_in_its_own_form() -> None:
    """A page restored from INT8 holds decoded INT8 values in HBM; if its pool then died
    (its copies gone), a FULL demotion stored those values as a FULL copy, and every later
    load of it answered ``exact`` for lossy KV (found by review)."""
    ctl, ex, hbm = _worker()
    asked: list = []
    demote = hbm.demote
    hbm.demote = lambda meta, targets, pool, drop: (asked.append(list(targets)),
                                                    demote(meta, targets, pool, drop))[1]
    try:
        (pressure,) = admitted(ctl.manager, "b", range(1), 1.0)
        rec = ctl.manager.table.pages[pressure.gid]
        rec.resident_codec, rec.copies = Codec.INT8, {}  # restored lossy, its pool gone since
        assert pressure.codec is Codec.FULL
        (result,) = ex.run([pressure])
    finally:
        ex.close()
    assert result.outcome is Outcome.DONE
    assert asked == [[(int(Tier.HOST), int(Codec.INT8))]]
    assert rec.copies == {Codec.INT8: Tier.HOST}
