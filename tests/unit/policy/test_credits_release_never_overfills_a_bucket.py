"""Credits (paper §2.4, "reserves bandwidth credit"): a token bucket never holds more
than its capacity. A link transfer released after the bucket has already refilled gives
back nothing beyond the capacity, so the link is never promised more than its burst."""

from __future__ import annotations

from agentkv_cluster.policy.credits import (
    BucketSpec,
    CreditConfig,
    CreditManager,
    CreditOutcome,
    CreditRequest,
    Resource,
)

LINK = Resource.LINK


def _manager() -> CreditManager:
    return CreditManager(CreditConfig(
        buckets={(LINK, "nic0"): BucketSpec(capacity=100, refill_per_s=100.0)},
        session={LINK: BucketSpec(capacity=100, refill_per_s=100.0)},
    ))


def _req(session: str, amount: int) -> CreditRequest:
    return CreditRequest(session=session, resource=LINK, amount=amount, link="nic0")


def test_release_after_the_refill_is_capped_at_the_capacity():
    cm = _manager()
    g = cm.acquire(_req("a", 80), now=0.0)
    assert (g.outcome, cm.available(LINK, "nic0", now=0.0)) == (CreditOutcome.GRANTED, 20)
    # 100 B/s: after 1 s the bucket is full again (20 + 100 -> capped at 100)
    assert cm.available(LINK, "nic0", now=1.0) == 100
    cm.release(g, now=1.0)  # the transfer was cancelled: 80 back, but capped at 100
    assert cm.available(LINK, "nic0", now=1.0) == 100
    # so a full burst (100) and then any more must wait
    assert cm.acquire(_req("a", 100), now=1.0).outcome is CreditOutcome.GRANTED
    assert cm.acquire(_req("b", 50), now=1.0).outcome is CreditOutcome.DELAYED
