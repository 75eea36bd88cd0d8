"""Per-link and per-session credits for HBM, host memory and link bandwidth.

Each request is charged to two token buckets: the shared bucket of its
(resource, link) and the session's own bucket of that resource. Link buckets
refill at the link's bandwidth; memory buckets (refill 0) get tokens back on
``release``. Work over credit is either offered a lower precision (when the
request allows it and nobody is waiting) or waits in a delay queue.

No starvation: the delay queue of a bucket is served round-robin over
sessions, and new requests never bypass waiting ones. When the session at the
head of the ring is blocked by the *shared* bucket, service stops there (its
turn is held until tokens accumulate); when it is blocked only by its *own*
session bucket it is skipped, since no other session can help it.

A session bucket may be work-conserving (``BucketSpec.borrow``): while no other
session waits for the shared bucket, a session may run past its own bucket on the
shared one's tokens (its own goes negative and is repaid on ``release``). Link credits
use it: a cap that only shares a link fairly should not leave the link idle while one
session's load waits. Memory credits do not: a session's share of memory is a quota.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from agentkv_cluster.policy.base import CostModel, PolicyError
from store.types import Codec


class Resource(enum.Enum):
    HBM = "hbm"
    HOST = "host"
    LINK = "link"


class CreditOutcome(enum.Enum):
    GRANTED = "granted"
    LOWER_PRECISION = "lower_precision"  # granted for fewer bytes at ``codec``
    DELAYED = "delayed"  # queued; a later ``poll`` grants it


@dataclass(frozen=True, kw_only=True)
class CreditRequest:
    session: Hashable  # any session key: a name, or (tenant, session) as the service's
    resource: Resource
    amount: int  # bytes
    link: str = "default"  # link (or memory pool) the bucket belongs to
    codec: Codec = Codec.FULL
    allow_lower_precision: bool = False


@dataclass(frozen=True, kw_only=True)
class CreditGrant:
    ticket: int
    request: CreditRequest
    outcome: CreditOutcome
    amount: int  # bytes actually charged (0 while DELAYED)
    codec: Codec
    granted_at: float | None  # None while DELAYED


class CreditError(PolicyError):
    """Base of credit errors."""


class UnknownLink(CreditError, KeyError):
    """No bucket configured for that (resource, link)."""


class CreditTooLarge(CreditError, ValueError):
    """A request larger than a bucket's capacity could never be granted."""


class UnknownTicket(CreditError, KeyError):
    """Release or cancel of a ticket that is not outstanding."""


@dataclass(frozen=True, kw_only=True)
class BucketSpec:
    capacity: int  # bytes: burst size (links) or pool size (memory)
    refill_per_s: float = 0.0  # link bandwidth; 0 for memory
    # session buckets only: past this bucket on the shared one while no other session waits
    borrow: bool = False


@dataclass(frozen=True, kw_only=True)
class CreditConfig:
    buckets: Mapping[tuple[Resource, str], BucketSpec]  # shared, per (resource, link)
    session: Mapping[Resource, BucketSpec]  # every session's own bucket per resource
    cost: CostModel = field(default_factory=CostModel)


@dataclass(slots=True)
class _Bucket:
    capacity: float
    rate: float
    tokens: float
    updated_at: float | None = None
    borrow: bool = False

    def refill(self, now: float) -> None:
        if self.updated_at is not None and now > self.updated_at and self.rate > 0:
            self.tokens = min(self.capacity, self.tokens + (now - self.updated_at) * self.rate)
        if self.updated_at is None or now > self.updated_at:
            self.updated_at = now


@dataclass(slots=True)
class _Queue:
    ring: deque[Hashable] = field(default_factory=deque)  # sessions with waiting work
    pending: dict[Hashable, deque[CreditGrant]] = field(default_factory=dict)


_LOWER = (Codec.INT8, Codec.INT4, Codec.LOW_RANK)
_EPS = 1e-6  # bytes: refill arithmetic in floats must not hold back an exact fit


class CreditManager:
    """Token buckets with a fair delay queue. Time is passed in."""

    def __init__(self, config: CreditConfig) -> None:
        self.config = config
        self._shared = {key: _Bucket(s.capacity, s.refill_per_s, s.capacity)
                        for key, s in config.buckets.items()}
        self._sessions: dict[tuple[Hashable, Resource], _Bucket] = {}
        self._queues: dict[tuple[Resource, str], _Queue] = {k: _Queue() for k in self._shared}
        self._outstanding: dict[int, CreditGrant] = {}
        self._next_ticket = 1

    def acquire(self, request: CreditRequest, now: float) -> CreditGrant:
        key = (request.resource, request.link)
        shared, own = self._buckets(request, now)
        if request.amount <= 0:
            raise ValueError(f"credit amount must be > 0, got {request.amount}")
        if request.amount > min(shared.capacity, own.capacity):
            raise CreditTooLarge(f"{request.amount} B exceeds the bucket capacity of {key}")
        ticket = self._next_ticket
        self._next_ticket += 1
        queue = self._queues[key]
        if not queue.ring:
            grant = self._try_grant(ticket, request, shared, own, now)
            if grant is not None:
                return grant
        waiting = CreditGrant(ticket=ticket, request=request, outcome=CreditOutcome.DELAYED,
                              amount=0, codec=request.codec, granted_at=None)
        if request.session not in queue.pending:
            queue.pending[request.session] = deque()
            queue.ring.append(request.session)
        queue.pending[request.session].append(waiting)
        self._outstanding[ticket] = waiting
        return waiting

    def poll(self, now: float) -> list[CreditGrant]:
        """Grant waiting requests that now fit, round-robin over sessions."""
        granted: list[CreditGrant] = []
        for key, queue in self._queues.items():
            shared = self._shared[key]
            shared.refill(now)
            skipped = 0
            while queue.ring and skipped < len(queue.ring):
                session = queue.ring[0]
                head = queue.pending[session][0]
                own = self._own(session, key[0], now)
                amount = head.request.amount
                # a borrowing session alone in the ring is not held back by its own bucket
                fits_own = (own.borrow and len(queue.ring) == 1) or amount <= own.tokens + _EPS
                if shared.tokens + _EPS < amount and fits_own:
                    break  # hold this session's turn until the shared bucket refills
                if not fits_own:
                    queue.ring.rotate(-1)
                    skipped += 1
                    continue
                queue.pending[session].popleft()
                queue.ring.popleft()
                if queue.pending[session]:
                    queue.ring.append(session)
                else:
                    del queue.pending[session]
                grant = self._charge(head.ticket, head.request, amount, head.request.codec,
                                     CreditOutcome.GRANTED, shared, own, now)
                granted.append(grant)
                skipped = 0
        return granted

    def release(self, grant: CreditGrant, now: float) -> None:
        """Return a grant's tokens (memory freed, or a link transfer cancelled)."""
        if self._outstanding.get(grant.ticket) is None or grant.granted_at is None:
            raise UnknownTicket(f"ticket {grant.ticket} is not an outstanding grant")
        del self._outstanding[grant.ticket]
        key = (grant.request.resource, grant.request.link)
        for bucket in (self._shared[key], self._own(grant.request.session, key[0], now)):
            bucket.refill(now)
            bucket.tokens = min(bucket.capacity, bucket.tokens + grant.amount)

    def cancel(self, ticket: int) -> None:
        """Withdraw a DELAYED request."""
        grant = self._outstanding.get(ticket)
        if grant is None or grant.granted_at is not None:
            raise UnknownTicket(f"ticket {ticket} is not waiting")
        del self._outstanding[ticket]
        queue = self._queues[(grant.request.resource, grant.request.link)]
        pending = queue.pending[grant.request.session]
        pending.remove(grant)
        if not pending:
            del queue.pending[grant.request.session]
            queue.ring.remove(grant.request.session)

    def available(self, resource: Resource, link: str, now: float) -> int:
        bucket = self._shared_bucket((resource, link))
        bucket.refill(now)
        return int(bucket.tokens)

    def waiting(self) -> int:
        return sum(len(d) for q in self._queues.values() for d in q.pending.values())

    def forget_session(self, session: Hashable) -> None:
        """Drop ``session``'s own buckets. Call only when it holds and waits for no credit:
        its buckets are then full, as a new session's are, so nothing is lost."""
        for resource in self.config.session:
            self._sessions.pop((session, resource), None)

    def session_buckets(self) -> int:
        """Sessions' own buckets held (one per session and resource)."""
        return len(self._sessions)

    # ------------------------------------------------------------ internals
    def _shared_bucket(self, key: tuple[Resource, str]) -> _Bucket:
        try:
            return self._shared[key]
        except KeyError:
            raise UnknownLink(f"no credit bucket for {key[0].value}/{key[1]}") from None

    def _own(self, session: Hashable, resource: Resource, now: float) -> _Bucket:
        bucket = self._sessions.get((session, resource))
        if bucket is None:
            spec = self.config.session[resource]
            bucket = _Bucket(spec.capacity, spec.refill_per_s, spec.capacity, borrow=spec.borrow)
            self._sessions[(session, resource)] = bucket
        bucket.refill(now)
        return bucket

    def _buckets(self, request: CreditRequest, now: float) -> tuple[_Bucket, _Bucket]:
        shared = self._shared_bucket((request.resource, request.link))
        shared.refill(now)
        return shared, self._own(request.session, request.resource, now)

    def _try_grant(self, ticket, request, shared, own, now) -> CreditGrant | None:
        """Called only while nobody waits for ``shared``: a borrowing session bucket
        does not limit the grant then."""
        available = (shared.tokens if own.borrow else min(shared.tokens, own.tokens)) + _EPS
        if request.amount <= available:
            return self._charge(ticket, request, request.amount, request.codec,
                                CreditOutcome.GRANTED, shared, own, now)
        if not request.allow_lower_precision:
            return None
        ratio = self.config.cost.codec_ratio
        for codec in _LOWER:
            if codec <= request.codec:
                continue
            amount = round(request.amount * ratio[codec] / ratio[request.codec])
            if 0 < amount <= available:
                return self._charge(ticket, request, amount, codec,
                                    CreditOutcome.LOWER_PRECISION, shared, own, now)
        return None

    def _charge(self, ticket, request, amount, codec, outcome, shared, own, now) -> CreditGrant:
        shared.tokens -= amount
        own.tokens -= amount
        grant = CreditGrant(ticket=ticket, request=request, outcome=outcome, amount=amount,
                            codec=codec, granted_at=now)
        self._outstanding[ticket] = grant
        return grant
