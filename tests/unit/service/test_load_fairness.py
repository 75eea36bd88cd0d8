"""A load that needs more room than other loads ever leave free at once is not starved:
once it has been blocked for room a while, later loads on its HBM actor wait for it (a
bounded time each). Pure: no Ray; the worker below moves no bytes."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.guard import Guarded
from agentkv_cluster.runtime.loads import EngineLoader, RoomQueue
from agentkv_cluster.runtime.strategies import make_strategy
from tests.unit.service.test_controller import MB, admitted, finish
from tests.unit.service.test_load_arrivals import _Worker as _BaseWorker


def test_a_later_load_waits_only_behind_an_older_one_blocked_long_enough_on_its_hbm() -> None:
    queue = RoomQueue(age_s=0.2, yield_s=1.0)
    old, young = queue.ticket(), queue.ticket()
    queue.blocked(old, {"h0"}, now=10.0)
    assert not queue.ahead(young, {"h0"}, now=10.1)  # not blocked long enough yet
    assert queue.ahead(young, {"h0", "h1"}, now=10.25)
    assert not queue.ahead(young, {"h1"}, now=11.0)  # another HBM actor: no reason to wait
    queue.blocked(young, {"h0"}, now=10.5)
    assert not queue.ahead(old, {"h0"}, now=11.0)  # a younger load never holds an older one
    queue.blocked(old, {"h0"}, now=10.9)  # blocked again: it keeps the time it first was
    assert queue.ahead(young, {"h0"}, now=10.25)
    queue.done(old)
    assert not queue.ahead(young, {"h0"}, now=20.0)


def test_waiting_behind_ends_when_the_older_load_is_done_or_at_the_bound() -> None:
    queue = RoomQueue(age_s=0.0, yield_s=1.0)
    old, young = queue.ticket(), queue.ticket()
    assert queue.wait_behind(young, {"h"}, time.monotonic() + 5.0) == 0.0  # none ahead
    queue.blocked(old, {"h"}, time.monotonic())
    waited = queue.wait_behind(young, {"h"}, time.monotonic() + 0.1)
    assert 0.09 <= waited < 1.0  # the bound: an older load that never gets its room
    threading.Timer(0.1, queue.done, args=(old,)).start()
    waited = queue.wait_behind(young, {"h"}, time.monotonic() + 5.0)
    assert 0.09 <= waited < 2.0  # woken when the older load was done, long before 5 s


class _Worker(_BaseWorker):
    """A worker with no prefetches to give room back."""

    @contextlib.contextmanager
    def room_wanted(self, hbms: set[str]) -> Iterator[int]:
        yield 0


def _churn(loader: EngineLoader, ctl: Guarded, session: str, stop: threading.Event,
           errors: list[BaseException]) -> None:
    """Load the session's two pages, hold them 30 ms, release them, again."""
    keys = [f"{session}/{i}".encode() for i in range(2)]
    gids = ctl.table.resolve("t", session, keys)
    try:
        while not stop.is_set():
            loader.load("t", session, keys)
            time.sleep(0.03)
            ctl.table.release_held("t", session, gids, time.monotonic())
            time.sleep(0.002)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


@pytest.mark.parametrize("policy", ["agentkv", "lru"])
def test_a_load_needing_the_whole_hbm_gets_it_while_smaller_loads_keep_pinning(policy) -> None:
    # Four pages fit; three sessions load two pages each, hold them 30 ms, and load them
    # again, so two of them always hold pins. The load of all four pages never saw the HBM
    # free: it was refused as busy at its deadline (45 s in the service) while the smaller
    # loads went on, 850 times each.
    ctl = Guarded(Controller(make_strategy(policy)))
    ctl.add_hbm("h", 4 * MB)
    for session in ("big", "s0", "s1", "s2"):
        finish(ctl, admitted(ctl, session, range(4 if session == "big" else 2), 0.0), 0.0)
    loader = EngineLoader(ctl, _Worker(ctl), check=lambda results: None)
    loader.deadline_s = 10.0
    stop, errors = threading.Event(), []
    churners = [threading.Thread(target=_churn, args=(loader, ctl, s, stop, errors))
                for s in ("s0", "s1", "s2")]
    for t in churners:
        t.start()
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        keys = [f"big/{i}".encode() for i in range(4)]
        reports = loader.load("t", "big", keys)
        took = time.monotonic() - t0
        ctl.table.release_held("t", "big", None, time.monotonic())  # the others go on
    finally:
        stop.set()
        for t in churners:
            t.join()
    assert len(reports) == 4 and not errors
    assert took < 5.0, f"the big load waited {took:.2f} s for room"
    phases = loader.phases[-1] if loader.phases[-1].pages == 4 else \
        next(p for p in loader.phases if p.pages == 4)
    assert phases.blocked_s > 0.0  # it did wait for room first
