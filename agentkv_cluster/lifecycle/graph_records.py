"""Records the event graph keeps: nodes, pages, branches, tasks, and the retention policy."""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from agentkv_cluster.lifecycle.types import NodeId, PageId, StateType, TypeTag

TaskKey = tuple[str, str, str]  # (tenant, session, task_id)


class NodeKind(enum.Enum):
    MODEL_CALL = "model_call"
    TOOL_CALL = "tool_call"
    OBSERVATION = "observation"
    VERIFICATION = "verification"
    SUMMARY = "summary"  # folded nodes older than the version window


class EdgeKind(enum.Enum):
    DATA = "data"  # producer -> consumer through a page
    CONTROL = "control"  # execution order on a branch


class BranchStatus(enum.Enum):
    OPEN = "open"
    ABANDONED = "abandoned"  # rolled back
    CLOSED = "closed"  # its task ended


class Blocker(enum.Enum):
    """Why a page cannot be retired yet."""

    CONSUMER = "consumer"  # a reachable consumer node is not done
    CONTEXT = "context"  # live context of an open task: its next model call reads it
    ROLLBACK = "rollback"  # an open branch may roll back to a state that includes it
    AUDIT = "audit"  # the audit policy wants a summary recorded first
    GENERATION = "generation"  # a prefix new tasks reuse, or in-flight tasks still read


@dataclass(frozen=True, kw_only=True)
class RetentionPolicy:
    """What the graph keeps besides live consumers."""

    window: int = 8  # unrolled nodes kept per task; older done nodes fold into a summary
    audit_types: frozenset[StateType] = frozenset(
        {StateType.FAILED_BRANCH, StateType.VERIFIED_RESULT}
    )
    keep_rollback_state: bool = True

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")


@dataclass(frozen=True, kw_only=True)
class GraphStats:
    tasks: int
    nodes: int
    summary_nodes: int
    control_edges: int
    data_edges: int
    pages: int
    branches: int


@dataclass(frozen=True, kw_only=True)
class PageInfo:
    """A read-only view of one page's graph state."""

    page_id: PageId
    tag: TypeTag
    task: TaskKey | None
    branch: str | None
    version: int
    last_touch: float
    producers: frozenset[NodeId]
    consumers: frozenset[NodeId]


@dataclass(frozen=True, kw_only=True)
class NodeInfo:
    """A read-only view of one node."""

    node_id: NodeId
    kind: NodeKind
    task: TaskKey
    branch: str | None
    version: int
    done: bool
    call_id: str | None
    successors: frozenset[NodeId]  # control edges out
    folded: int


@dataclass(slots=True)
class Node:
    node_id: NodeId
    kind: NodeKind
    task: TaskKey
    branch: str | None  # None for a summary: it may span branches
    version: int
    done: bool
    reads: set[PageId] = field(default_factory=set)
    writes: set[PageId] = field(default_factory=set)
    folded: int = 0  # how many nodes a summary stands for
    call_id: str | None = None


@dataclass(slots=True)
class PageRecord:
    page_id: PageId
    tag: TypeTag
    task: TaskKey | None  # None for a shared fixed prefix
    branch: str | None
    version: int  # event version of the latest production
    last_touch: float
    cold_version: int | None = None  # event version that superseded it
    audited: bool = False
    producers: set[NodeId] = field(default_factory=set)
    consumers: set[NodeId] = field(default_factory=set)
    users: set[TaskKey] = field(default_factory=set)  # open tasks started on this prefix


@dataclass(slots=True)
class Branch:
    name: str
    parent: str | None
    fork_version: int
    head: NodeId | None
    status: BranchStatus = BranchStatus.OPEN
    nodes: int = 0  # unfolded nodes on it
    pages: set[PageId] = field(default_factory=set)


@dataclass(slots=True)
class Task:
    key: TaskKey
    generation: int
    open: bool = True
    branches: dict[str, Branch] = field(default_factory=dict)
    window: deque[NodeId] = field(default_factory=deque)
    summary: NodeId | None = None
    calls: dict[str, NodeId] = field(default_factory=dict)  # call_id -> unfolded node
    prefix_pages: tuple[PageId, ...] = ()
