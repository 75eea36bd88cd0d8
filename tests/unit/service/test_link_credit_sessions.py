"""Link credits per session: two tenants' sessions of one name are two sessions with a
bucket each, served in turn, and a session's bucket lives only while it has a transfer on
the link (closed sessions, and sessions that just stop, leave none behind)."""

from __future__ import annotations

import threading
import time

import pytest

from agentkv_cluster.lifecycle.types import SessionKey
from agentkv_cluster.runtime.link_credits import Abandoned, Link, LinkCredits

MINE, THEIRS = SessionKey("t1", "main"), SessionKey("t2", "main")


def _queued(credits: LinkCredits, link: Link, n: int) -> None:
    """Wait until ``n`` foreground requests wait on ``link`` (queued: ``wake`` takes the
    lock they queue under)."""
    for _ in range(2000):
        if credits.waiting[link] >= n:
            credits.wake()
            return
        time.sleep(0.005)
    raise AssertionError(f"{n} requests never queued on {link}")


def test_two_tenants_sessions_of_one_name_are_served_in_turn_from_their_own_buckets() -> None:
    credits = LinkCredits(per_link=1, per_session=1)
    link = Link("pool", "hbm0")
    first = credits.acquire(MINE, link, timeout_s=2.0)
    order: list[str] = []

    def transfer(name: str, key: SessionKey) -> None:
        grant = credits.acquire(key, link, timeout_s=5.0)
        order.append(name)
        credits.release(link, grant)

    threads = []
    for n, (name, key) in enumerate([("mine-2", MINE), ("mine-3", MINE), ("theirs-1", THEIRS)]):
        threads.append(threading.Thread(target=transfer, args=(name, key)))
        threads[-1].start()
        _queued(credits, link, n + 1)
    credits.release(link, first)
    for t in threads:
        t.join(5.0)
    # Round robin over two sessions: the other tenant's request is served before my
    # second waiting one (first, if the queue turned while mine still held its credit).
    # One bucket for both "main"s served them first come, first served (mine-2, mine-3,
    # theirs-1): the other tenant's request waited behind every one of mine.
    assert order in (["mine-2", "theirs-1", "mine-3"], ["theirs-1", "mine-2", "mine-3"])


def test_a_sessions_bucket_lives_only_while_it_has_a_transfer_on_the_link() -> None:
    credits = LinkCredits(per_link=2, per_session=1)
    link = Link("pool", "hbm0")
    mine = credits.acquire(MINE, link, timeout_s=1.0)
    theirs = credits.acquire(THEIRS, link, timeout_s=1.0)
    assert credits.session_buckets() == 2
    with pytest.raises(TimeoutError):  # the link is full: it waits, then gives up
        credits.acquire(SessionKey("t3", "main"), link, timeout_s=0.05)
    assert credits.session_buckets() == 2  # the one that gave up left none
    credits.release(link, mine)
    assert credits.session_buckets() == 1
    credits.release(link, theirs)
    assert credits.session_buckets() == 0
    with pytest.raises(Abandoned):  # gave way before it queued: no bucket was made
        credits.acquire(MINE, link.as_background(), give_up=lambda: True)
    assert credits.session_buckets() == 0 and sum(credits.in_flight.values()) == 0
