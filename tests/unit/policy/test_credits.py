"""Credits: token buckets per link and per session, delay queue, lower precision, fairness."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv_cluster.policy.credits import (
    BucketSpec,
    CreditConfig,
    CreditManager,
    CreditOutcome,
    CreditRequest,
    CreditTooLarge,
    Resource,
    UnknownLink,
    UnknownTicket,
)
from store.types import Codec

LINK = Resource.LINK


def manager(link_cap=100, link_rate=100.0, session_cap=60, session_rate=60.0, host_cap=1000):
    return CreditManager(CreditConfig(
        buckets={(LINK, "nic0"): BucketSpec(capacity=link_cap, refill_per_s=link_rate),
                 (Resource.HOST, "pool"): BucketSpec(capacity=host_cap)},
        session={LINK: BucketSpec(capacity=session_cap, refill_per_s=session_rate),
                 Resource.HOST: BucketSpec(capacity=host_cap // 2),
                 Resource.HBM: BucketSpec(capacity=10)},
    ))


def req(session, amount, resource=LINK, link="nic0", **kw):
    return CreditRequest(session=session, resource=resource, amount=amount, link=link, **kw)


def test_grant_then_delay_then_poll_when_the_bucket_refills():
    cm = manager()
    g1 = cm.acquire(req("a", 50), now=0.0)
    assert (g1.outcome, g1.amount, g1.granted_at) == (CreditOutcome.GRANTED, 50, 0.0)
    g2 = cm.acquire(req("b", 60), now=0.0)  # shared bucket has 50 left
    assert (g2.outcome, g2.amount, g2.granted_at) == (CreditOutcome.DELAYED, 0, None)
    assert cm.waiting() == 1
    assert cm.poll(now=0.05) == []  # 55 tokens: still short
    (g,) = cm.poll(now=0.1)  # 60 tokens
    assert (g.ticket, g.outcome, g.amount, g.granted_at) == (g2.ticket, CreditOutcome.GRANTED,
                                                             60, 0.1)
    assert cm.available(LINK, "nic0", now=0.1) == 0


def test_lower_precision_offer_when_over_credit():
    cm = manager(session_cap=100)
    cm.acquire(req("a", 50), now=0.0)  # 50 left in the link bucket
    g = cm.acquire(req("b", 80, allow_lower_precision=True), now=0.0)
    # INT8 (0.53) would need 42 B: fits in 50
    assert (g.outcome, g.codec, g.amount) == (CreditOutcome.LOWER_PRECISION, Codec.INT8, 42)
    g2 = cm.acquire(req("c", 60, allow_lower_precision=True), now=0.0)  # 8 left: INT4 19, LR 15
    assert g2.outcome is CreditOutcome.DELAYED


def test_new_requests_never_bypass_waiting_ones():
    cm = manager()
    cm.acquire(req("a", 60), now=0.0)
    waiting = cm.acquire(req("b", 60), now=0.0)  # 40 left: waits
    small = cm.acquire(req("c", 10), now=0.0)  # would fit, but b waits first
    assert waiting.outcome is small.outcome is CreditOutcome.DELAYED
    granted = cm.poll(now=0.2)  # 60 tokens: b first, then c's turn
    assert [g.ticket for g in granted] == [waiting.ticket]
    # 0.3 - 0.2 is 0.0999... in floats: an exact fit must still be granted
    assert [g.ticket for g in cm.poll(now=0.3)] == [small.ticket]


def test_memory_credits_return_on_release_and_session_cap_applies():
    cm = manager(host_cap=1000)
    g = cm.acquire(req("a", 500, Resource.HOST, "pool"), now=0.0)
    over = cm.acquire(req("a", 1, Resource.HOST, "pool"), now=0.0)  # session cap 500 reached
    assert over.outcome is CreditOutcome.DELAYED
    other = cm.acquire(req("b", 1, Resource.HOST, "pool"), now=0.0)
    assert other.outcome is CreditOutcome.DELAYED  # queued behind a (no bypass) ...
    assert [x.ticket for x in cm.poll(now=1.0)] == [other.ticket]  # ... but a is skipped
    cm.release(g, now=2.0)
    assert [x.ticket for x in cm.poll(now=2.0)] == [over.ticket]
    with pytest.raises(UnknownTicket):
        cm.release(g, now=3.0)


def _slots(per_link=4, per_session=2, borrow=True):
    """Concurrency credits as the service uses them: one token per transfer in flight."""
    return CreditManager(CreditConfig(
        buckets={(LINK, "l"): BucketSpec(capacity=per_link)},
        session={LINK: BucketSpec(capacity=per_session, borrow=borrow)}))


def test_a_borrowing_session_uses_the_whole_link_while_no_one_else_waits():
    cm = _slots()
    grants = [cm.acquire(req("a", 1, link="l"), now=0.0) for _ in range(5)]
    # past its own cap of 2, up to the link's 4; the fifth waits for the link
    assert [g.outcome for g in grants] == [CreditOutcome.GRANTED] * 4 + [CreditOutcome.DELAYED]
    cm.release(grants[0], now=1.0)
    assert [g.ticket for g in cm.poll(now=1.0)] == [grants[4].ticket]  # still alone
    strict = _slots(borrow=False)
    held = [strict.acquire(req("a", 1, link="l"), now=0.0) for _ in range(3)]
    assert [g.outcome for g in held][2] is CreditOutcome.DELAYED  # the quota, not the link


def test_a_borrower_gives_way_as_soon_as_another_session_waits():
    cm = _slots()
    a = [cm.acquire(req("a", 1, link="l"), now=0.0) for _ in range(6)]  # 4 granted, 2 wait
    b = [cm.acquire(req("b", 1, link="l"), now=0.0) for _ in range(2)]
    assert all(g.outcome is CreditOutcome.DELAYED for g in a[4:] + b)
    order = []
    for i in range(4):  # a's transfers end one by one: each freed credit goes to b first
        cm.release(a[i], now=1.0 + i)
        order += [g.request.session for g in cm.poll(now=1.0 + i)]
    # b holds none, a is over its own cap: b gets both of its credits before a gets more,
    # then a alone again borrows
    assert order == ["b", "b", "a", "a"]


def test_cancel_withdraws_a_waiting_request():
    cm = manager()
    cm.acquire(req("a", 60), now=0.0)
    waiting = cm.acquire(req("b", 60), now=0.0)
    cm.cancel(waiting.ticket)
    assert cm.waiting() == 0
    assert cm.poll(now=10.0) == []
    with pytest.raises(UnknownTicket):
        cm.cancel(waiting.ticket)


def test_validation():
    cm = manager()
    with pytest.raises(UnknownLink):
        cm.acquire(req("a", 1, link="nic9"), now=0.0)
    with pytest.raises(CreditTooLarge):
        cm.acquire(req("a", 61), now=0.0)  # over the session bucket capacity: never grantable
    with pytest.raises(ValueError):
        cm.acquire(req("a", 0), now=0.0)
    assert cm.available(LINK, "nic0", now=0.0) == 100


def test_fairness_and_no_starvation_with_64_sessions():
    # link: 1000 B burst, 1000 B/s; 64 sessions each keep 5 requests of 100 B queued
    cm = manager(link_cap=1000, link_rate=1000.0, session_cap=1000, session_rate=1000.0)
    sessions = [f"s{i:02d}" for i in range(64)]
    tickets: dict[int, str] = {}
    granted_at: dict[int, float] = {}
    for round_ in range(5):
        for s in sessions:
            g = cm.acquire(req(s, 100), now=0.0)
            tickets[g.ticket] = s
            if g.granted_at is not None:
                granted_at[g.ticket] = 0.0
    now = 0.0
    counts_by_time = []
    while cm.waiting():
        now += 0.05  # 50 B per step
        for g in cm.poll(now):
            granted_at[g.ticket] = now
        per_session = {s: 0 for s in sessions}
        for t in granted_at:
            per_session[tickets[t]] += 1
        counts_by_time.append(max(per_session.values()) - min(per_session.values()))
    assert len(granted_at) == 64 * 5  # nobody starved
    assert max(counts_by_time) <= 1  # round-robin: never more than one grant apart
    assert now == pytest.approx(64 * 5 * 100 / 1000 - 1.0, abs=0.06)  # link fully used


def test_large_request_is_not_starved_by_a_stream_of_small_ones():
    cm = manager(link_cap=100, link_rate=100.0, session_cap=100, session_rate=100.0)
    cm.acquire(req("small0", 50), now=0.0)
    big = cm.acquire(req("big", 100), now=0.0)
    assert big.outcome is CreditOutcome.DELAYED
    now, got_big, small_before = 0.0, None, 0
    for step in range(1, 40):
        now = step * 0.1
        small = cm.acquire(req(f"small{step}", 10), now=now)  # a new one every 100 ms
        small_before += small.granted_at is not None
        for g in cm.poll(now):
            if g.ticket == big.ticket:
                got_big = now
            elif got_big is None:
                small_before += 1
        if got_big:
            break
    # 50 B left at t=0 refill to 100 B at t=0.5; no small request jumped the queue
    assert got_big == pytest.approx(0.5)
    assert small_before == 0


@pytest.mark.parametrize("seed", range(5))
def test_random_load_grants_everything_in_per_session_order(seed):
    rng = np.random.default_rng(seed)
    cm = manager(link_cap=500, link_rate=1000.0, session_cap=300, session_rate=400.0)
    issued: dict[str, list[int]] = {}
    granted: dict[str, list[int]] = {}
    now = 0.0
    for _ in range(400):
        now += float(rng.exponential(0.02))
        s = f"s{int(rng.integers(16))}"
        g = cm.acquire(req(s, int(rng.integers(1, 300))), now=now)
        issued.setdefault(s, []).append(g.ticket)
        if g.granted_at is not None:
            granted.setdefault(s, []).append(g.ticket)
        for g in cm.poll(now):
            granted.setdefault(g.request.session, []).append(g.ticket)
        assert cm.available(LINK, "nic0", now=now) >= 0
    while cm.waiting():
        now += 0.05
        for g in cm.poll(now):
            granted.setdefault(g.request.session, []).append(g.ticket)
    assert granted == issued  # everything granted, each session in its own FIFO order
