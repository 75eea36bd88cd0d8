"""Plain records the controller, executor and actors exchange (no Ray, no I/O)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.policy.base import PageView
from store.types import Codec, Tier


class RuntimeError_(Exception):
    """Base of the runtime's own errors."""


class UnknownSession(RuntimeError_, KeyError):
    pass


class UnknownPageKey(RuntimeError_, KeyError):
    pass


class PageLost(RuntimeError_):
    """No copy of the page survives anywhere: the engine must re-prefill it."""


class TenantErased(RuntimeError_):
    """The tenant was erased (or is being erased) while the request ran: nothing of it is
    served, and what the request had started was undone."""


@dataclass(frozen=True, kw_only=True)
class TenantForgotten:
    """What the controller dropped of an erased tenant."""

    keys: dict[str, list[bytes]]  # per HBM actor: every key of the tenant's pages there
    pages: int
    resident: int  # pages that had a working copy in HBM
    sessions: int
    pins: int  # pins held on the tenant's pages (loads prepared and not released)
    cancelled: int  # scheduled gap migrations and prefetches of its pages
    straggling: int  # pages whose transfer had not ended when the wait gave up


@dataclass(frozen=True, kw_only=True)
class KvShape:
    """Geometry of a KV page: K then V, each [layers, kv_heads, tokens, head_dim]."""

    layers: int
    kv_heads: int
    tokens: int
    head_dim: int
    dtype: str = "float16"

    def nbytes(self) -> int:
        item = {"float16": 2, "bfloat16": 2, "float32": 4}[self.dtype]
        return 2 * self.layers * self.kv_heads * self.tokens * self.head_dim * item


@dataclass(frozen=True, kw_only=True)
class PageMeta:
    """What the service knows of a page when the engine stores it."""

    key: bytes  # blinded directory key (per tenant or PUBLIC namespace)
    digest: bytes  # PageIdentity.digest()
    tenant: str  # the tenant whose session stored the page
    namespace: str  # key and sealing namespace: ``tenant`` or "public"
    session: str
    page_id: int  # the engine's id within the session
    state_type: StateType
    length: int  # full-precision bytes
    tokens: int
    shape: KvShape | None = None  # None: opaque bytes, only Codec.FULL applies


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
    pins: int = 0
    busy: bool = False  # a demote or restore is in flight
    hidden_s: float = 0.0  # restore time already spent in a gap (prefetch)
    restored_at: float | None = None


class ActionKind(enum.Enum):
    DEMOTE = "demote"  # copy to the pool (if no copy in that form yet) and drop HBM
    RESTORE = "restore"  # bring a working copy back into HBM
    DELETE = "delete"  # page retired: drop every copy


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
    reason: str = ""
    session: str = ""
    tenant: str = ""  # DELETE: the page's key namespace
    key: bytes = b""  # DELETE: the record is gone from the controller by then
    pool: str = ""  # DELETE: the pool holding its copies


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
