"""The transfer worker's two lanes: an engine's work never waits for a thread behind
background moves, and a background move an engine wants before it started gives way at
once (pure: no Ray, no bytes; the actions here need no actor)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.executor import Executor, LinkCredits
from agentkv_cluster.runtime.guard import Guarded
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
                       codec=Codec.INT4, reason=Reason.GAP, session="a")


def test_an_engine_action_runs_while_every_background_thread_is_taken(parts) -> None:
    _ctl, ex = parts
    delete = Action(kind=ActionKind.DELETE, gid=99, hbm="h", tier=Tier.HOST,
                    codec=Codec.FULL, reason=Reason.RETIRE, session="a", key=b"k",
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
