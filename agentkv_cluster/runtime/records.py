"""Plain records the controller, executor and actors exchange (no Ray, no I/O)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from agentkv_cluster.lifecycle.types import SessionKey, StateType
from agentkv_cluster.policy.base import EvictionPolicy, GapPlan, PageView
from store.types import KV_DTYPE_BYTES, Codec, Tier


class RuntimeError_(Exception):
    """Base of the runtime's own errors."""


class RequestRefused(RuntimeError_):
    """Bad input from the engine or orchestrator; nothing was changed."""


class RefusedNotFound(RequestRefused):
    """Refused because the session is not open here, or a page is not stored in it (the
    API's ``not_found``)."""


class PageConflict(RequestRefused):
    """A page's identity is stored already with another size or shape (the first stays)."""


class UnknownSession(RuntimeError_, KeyError):
    __str__ = RuntimeError_.__str__  # the message as written (KeyError quotes it)


class UnknownPageKey(RuntimeError_, KeyError):
    __str__ = RuntimeError_.__str__


class TenantErased(RuntimeError_):
    """The tenant was (or is being) erased meanwhile: nothing served, what began undone."""


@dataclass(frozen=True, kw_only=True)
class PoolReceipt:
    """What a store or restore moved: the copy's tier and the plaintext bytes of its form
    that crossed the link. Sent as ``wire()`` (plain ints: Ray's msgpack path)."""

    tier: Tier
    nbytes: int

    def wire(self) -> tuple[int, int]:
        return int(self.tier), self.nbytes

    @classmethod
    def from_wire(cls, wire: Sequence[int]) -> PoolReceipt:
        return cls(tier=Tier(wire[0]), nbytes=int(wire[1]))


@dataclass(frozen=True, kw_only=True)
class DemoteReceipt:
    """What an HBM actor's demotion stored (``HbmActor.demote``); sent as ``wire()``."""

    copies: tuple[tuple[int, int], ...]  # (tier, codec) now held by the pool
    tier_bytes: tuple[int, ...]  # bytes written to each of those copies' tiers
    link_bytes: int  # bytes that crossed the link
    pool: str

    def wire(self) -> tuple:
        return self.copies, self.tier_bytes, self.link_bytes, self.pool

    @classmethod
    def from_wire(cls, wire: Sequence) -> DemoteReceipt:
        copies, sizes, link, pool = wire
        return cls(copies=tuple((int(t), int(c)) for t, c in copies),
                   tier_bytes=tuple(int(n) for n in sizes), link_bytes=int(link), pool=pool)


@dataclass(frozen=True, kw_only=True)
class RestoreReceipt:
    """What an HBM actor's restore brought in (``HbmActor.restore``); sent as ``wire()``."""

    tier: int
    codec: int
    link_bytes: int
    exact: bool

    def wire(self) -> tuple[int, int, int, bool]:
        return self.tier, self.codec, self.link_bytes, self.exact

    @classmethod
    def from_wire(cls, wire: Sequence) -> RestoreReceipt:
        return cls(tier=int(wire[0]), codec=int(wire[1]), link_bytes=int(wire[2]),
                   exact=bool(wire[3]))


@dataclass(frozen=True, kw_only=True)
class PoolHolding:
    """What a pool keeps of one page (``PoolActor.holds``): its copies, and the page's geometry
    read back from their records (a page found through the directory is adopted with them)."""

    copies: tuple[tuple[Tier, Codec], ...]
    length: int  # the FULL page's bytes
    state_type: StateType
    shape: KvShape | None
    structured: bool = False  # a copy was stored for code or JSON output

    def wire(self) -> tuple:
        """Plain values for Ray's msgpack path, as ``PoolReceipt.wire``."""
        return (tuple((int(t), int(c)) for t, c in self.copies), self.length,
                self.state_type.value, None if self.shape is None else self.shape.stored(),
                self.structured)

    @classmethod
    def from_wire(cls, wire: Sequence) -> PoolHolding:
        copies, length, state_type, shape, structured = wire
        return cls(copies=tuple((Tier(t), Codec(c)) for t, c in copies), length=int(length),
                   state_type=StateType(state_type), shape=KvShape.from_stored(shape),
                   structured=bool(structured))


@dataclass(frozen=True, kw_only=True)
class KvShape:
    """Geometry of a KV page: K then V, each [layers, kv_heads, tokens, head_dim]."""

    layers: int
    kv_heads: int
    tokens: int
    head_dim: int
    dtype: str = "float16"

    def nbytes(self) -> int:
        item = KV_DTYPE_BYTES[self.dtype]
        return 2 * self.layers * self.kv_heads * self.tokens * self.head_dim * item

    def dims(self) -> list[int]:
        """[layers, kv_heads, tokens, head_dim], as the wire and pool headers carry it."""
        return [self.layers, self.kv_heads, self.tokens, self.head_dim]

    @classmethod
    def from_dims(cls, dims: list[int], dtype: str = "float16") -> KvShape:
        return cls(layers=dims[0], kv_heads=dims[1], tokens=dims[2], head_dim=dims[3],
                   dtype=dtype)

    def stored(self) -> list:
        """[layers, kv_heads, tokens, head_dim, dtype]: as pool records keep it."""
        return [*self.dims(), self.dtype]

    @classmethod
    def from_stored(cls, stored: Sequence | None) -> KvShape | None:
        return None if stored is None else cls.from_dims(list(stored[:4]), str(stored[4]))


@dataclass(frozen=True, kw_only=True)
class PageMeta:
    """What the service knows of a page when the engine stores it."""

    key: bytes  # blinded directory key (per tenant or PUBLIC namespace)
    digest: bytes  # PageIdentity.digest()
    tenant: str  # the tenant whose session stored the page
    namespace: str  # key and sealing namespace: ``tenant`` or PUBLIC ("_public")
    session: str
    page_id: int  # the engine's id within the session
    state_type: StateType
    length: int  # full-precision bytes
    tokens: int
    shape: KvShape | None = None  # None: opaque bytes, only Codec.FULL applies
    content_hash: bytes = b""  # BLAKE2b-128 of the page's bytes (for the audit summary)
    structured: bool = False  # feeds code or JSON output: the risk controller keeps it FULL

    def erased_with(self, tenant: str) -> bool:
        """Goes with ``tenant``'s erasure: its own page, or one in its namespace (PUBLIC)."""
        return tenant in (self.tenant, self.namespace)

    @property
    def session_key(self) -> SessionKey:
        return SessionKey(self.tenant, self.session)


class HbmFull(Exception):
    """Pinned pages alone fill the HBM actor: nothing can be admitted or restored."""


@dataclass(slots=True)
class HbmBudget:
    """The page manager's account of one HBM actor."""

    capacity: int
    policy: EvictionPolicy
    used: int = 0
    sessions: int = 0


@dataclass(slots=True)
class SessionState:
    """The page manager's account of one open session."""

    hbm: str
    serial: int = 0  # this opening's own number: a session of the same name opened anew differs
    pages: set[int] = field(default_factory=set)
    tools: dict[str, tuple[str, float, GapPlan | None]] = field(default_factory=dict)
    pinned: dict[int, float] = field(default_factory=dict)  # gid -> when this session pinned it


@dataclass(slots=True)
class PageRecord:
    gid: int
    meta: PageMeta
    view: PageView
    hbm: str  # the HBM actor this page's session is placed on
    resident: bool = False  # a working copy is in HBM
    resident_codec: Codec = Codec.FULL  # form of the HBM working copy
    copies: dict[Codec, Tier] = field(default_factory=dict)  # pool copies: form -> tier
    pool: str = ""  # pool actor holding the copies
    stored: dict[Tier, int] = field(default_factory=dict)  # bytes of those copies per tier
    pins: int = 0
    busy: bool = False  # a demote or restore is in flight
    # a demotion copied it out, its HBM copy stays until the worker decides
    leaving: bool = False  # (``Controller.keep_if_room``): a load may take it back meanwhile
    hidden_s: float = 0.0  # restore time already spent in a gap (prefetch)
    # the pool copy a demotion made while its HBM copy stayed (``keep_if_room``): until
    # the page is read again, a pressure demotion drops it, moving no bytes
    clean_copy: Codec | None = None
    # Features of the page's last reuse prediction (eq. 2), until its outcome is known:
    # read again (``access``) or retired unread; the predictor learns from that pair.
    phi: np.ndarray | None = None

    def mark_structured(self, structured: bool) -> None:
        """A storer's page feeds code or JSON output: the record (and the copies the pool
        stores of it from now on) keep it exact; the mark is never taken back."""
        if structured and not self.meta.structured:
            self.meta, self.view.produces_structured = replace(self.meta, structured=True), True

    def copy_for(self, codec: Codec) -> Codec | None:
        """The most precise pool copy at least as precise as ``codec`` (pages are
        immutable: it holds all a copy in ``codec`` would), or None."""
        return min((c for c in self.copies if c <= codec), default=None)

    @property
    def arriving(self) -> bool:
        """Its bytes are on their way into HBM (a prefetch, another load's restore, an
        admission): a load pins it as it is and waits only for the arrival itself."""
        return self.busy and self.resident and not self.leaving

    @property
    def moving_out(self) -> bool:
        """A demotion of it is in flight and its HBM copy is not to be had meanwhile: the
        worker decided to drop it (until then it is ``leaving``: a load takes it back)."""
        return self.busy and not self.resident and not self.leaving


class ActionKind(enum.Enum):
    DEMOTE = "demote"  # copy to the pool (if no copy in that form yet), then drop HBM
    RESTORE = "restore"  # bring a working copy back into HBM
    DELETE = "delete"  # page retired: drop every copy


class Reason(enum.Enum):
    """Why an action exists; the executor and the controller act on it."""

    PRESSURE = "pressure"  # DEMOTE: room for an admission, a restore or a prefetch
    GAP = "gap"  # DEMOTE: a gap migration during the session's tool call (background)
    WRITE_THROUGH = "write-through"  # DEMOTE keep=True: a fixed prefix copied to the pool
    ACCESS = "access"  # RESTORE: an engine waits for the page (foreground)
    PREFETCH = "prefetch"  # RESTORE: before the predicted tool return (background)
    REFILL = "refill"  # RESTORE: a pressure victim back into free room before the return
    RETIRE = "retire"  # DELETE: every copy
    SHARED = "shared"  # DELETE: only the HBM copy (another HBM actor shares the page)


@dataclass(frozen=True, kw_only=True)
class Action:
    kind: ActionKind
    gid: int
    hbm: str
    tier: Tier = Tier.HOST
    codec: Codec = Codec.FULL
    reference: bool = False  # also keep a FULL reference copy on NVMe
    keep: bool = False  # DEMOTE only: copy to the pool but keep the HBM copy (write-through)
    start_at: float = 0.0
    reason: Reason = Reason.PRESSURE
    session: SessionKey | None = None  # whose link credits the move takes (link_credits.py)
    tenant: str = ""  # DELETE: the page's key namespace
    key: bytes = b""  # DELETE: the record is gone from the controller by then
    pool: str = ""  # DELETE: the pool holding its copies


class Outcome(enum.Enum):
    DONE = "done"
    FAILED = "failed"
    ABANDONED = "abandoned"  # a background move gave way: an engine needs the page now
    ERASED = "erased"  # the page's tenant is being erased: the move was cancelled
    ACTOR_GONE = "actor_gone"  # an HBM or pool actor the move needed died
    NO_ROOM = "no_room"  # a pool had room on no tier (NvmeTierFull), or the arena none


@dataclass(frozen=True, kw_only=True)
class TransferResult:
    """What the executor reports for one action (the controller's only feedback)."""

    action: Action
    outcome: Outcome
    error: str = ""  # the exception, for logs and the caller's message
    elapsed_s: float = 0.0
    copies: tuple[tuple[Tier, Codec], ...] = ()  # DEMOTE: pool copies now held
    tier_bytes: tuple[int, ...] = ()  # DEMOTE: bytes of each of those copies
    pool: str = ""  # DEMOTE: the pool holding them
    source: str = ""  # RESTORE: hbm | host | nvme | remote
    exact: bool = True  # RESTORE: the working copy is FULL precision

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.DONE


@dataclass(slots=True)
class LoadPhases:
    """Where one engine load's time went, in seconds (metrics: ``agentkv_load_phase_seconds``):
    waiting for its pages to stop being moved out (``settle``), for room (``blocked``: the
    HBM full of other loads' pins, or behind an older load starved of room), its own
    demotions and restores (``transfer``), for pages on their way in (``arrival``)."""

    settle_s: float = 0.0
    blocked_s: float = 0.0
    transfer_s: float = 0.0
    arrival_s: float = 0.0
    total_s: float = 0.0
    pages: int = 0
    restored: int = 0

    PHASES = ("settle", "blocked", "transfer", "arrival", "total")

    def seconds(self) -> tuple[float, ...]:
        """The phases' seconds in ``PHASES`` order."""
        return (self.settle_s, self.blocked_s, self.transfer_s, self.arrival_s, self.total_s)


RETIRED_TENANT = ""  # the erased tenants' counts (no tenant is named "": security.keyring)


@dataclass(frozen=True, kw_only=True)
class MetricsSince:
    """What the metrics exporter pulls from the controller on each scrape
    (``ControllerActor.metrics_since``): new entries, then cumulative counts. An erased
    tenant's counts are folded into ``RETIRED_TENANT``'s, so they stay whole without the
    controller keeping (or sending) its name."""

    cursor: int  # pass it to the next call
    waits: list[tuple[str, float]]  # credit waits since the last cursor: (tier label, s)
    phases: list[LoadPhases]  # engine loads since the last call
    hbm_used: int  # bytes of HBM in use now
    recompute: dict[str, int]  # tenant -> tokens lost for good
    traffic: dict[tuple[str, str], int]  # (tenant, pool tier) -> bytes moved into it
    codecs: dict[tuple[str, str], int]  # (tenant, codec) -> pool copies written
    gave_room: int  # prefetches that gave their HBM room to a blocked load


@dataclass(frozen=True, kw_only=True)
class LoadReport:
    """Per page outcome of an engine load."""

    key: bytes
    source: str  # hbm | host | nvme | remote | recompute
    delay_s: float
    hidden_s: float
    exact: bool
    codec: Codec
    nbytes: int
    hbm: str  # the HBM actor the page is pinned in (``complete_load`` reads it there)
