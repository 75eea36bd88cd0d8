"""Storage, version-window folding and queries of the event graph (``graph.EventGraph``)."""

from __future__ import annotations

from agentkv_cluster.lifecycle import events as ev
from agentkv_cluster.lifecycle.graph_records import (
    Blocker,
    BranchStatus,
    EdgeKind,
    GraphStats,
    Node,
    NodeInfo,
    NodeKind,
    PageInfo,
    PageRecord,
    RetentionPolicy,
    Task,
    TaskKey,
)
from agentkv_cluster.lifecycle.types import NodeId, PageId, StateType, TypeTag, UnknownPage


class PageStillNeeded(ValueError):
    """``retire`` on a page the graph still needs; nothing was changed."""


class UnknownNode(KeyError):
    """A node id the graph does not hold."""


class GraphBase:
    def __init__(self, policy: RetentionPolicy) -> None:
        self.policy = policy
        self._nodes: dict[NodeId, Node] = {}
        self._succ: dict[NodeId, set[NodeId]] = {}  # control edges
        self._pred: dict[NodeId, set[NodeId]] = {}
        self._pages: dict[PageId, PageRecord] = {}
        self._tasks: dict[TaskKey, Task] = {}
        self._generations: dict[str, int] = {}  # tenant -> current prefix generation
        self._prefixes: dict[str, set[PageId]] = {}  # tenant -> fixed-prefix pages
        self._next_node = 0

    # ---- building blocks used by the event handlers ------------------------
    def _add_node(self, task: Task, branch_name: str, kind: NodeKind, version: int,
                  *, done: bool) -> Node:
        branch = task.branches[branch_name]
        node = Node(NodeId(self._next_node), kind, task.key, branch_name, version, done)
        self._next_node += 1
        self._nodes[node.node_id] = node
        self._succ[node.node_id] = set()
        self._pred[node.node_id] = set()
        if branch.head is not None:
            head = self._nodes[branch.head]
            if head.kind is NodeKind.MODEL_CALL:  # a model call ends when its branch moves on
                head.done = True
            self._add_control(head.node_id, node.node_id)
        branch.head = node.node_id
        branch.nodes += 1
        task.window.append(node.node_id)
        return node

    def _add_control(self, src: NodeId, dst: NodeId) -> None:
        if src != dst:
            self._succ[src].add(dst)
            self._pred[dst].add(src)

    def _link_reads(self, node: Node, pages: tuple[int, ...], now: float) -> set[PageId]:
        for pid in pages:
            rec = self._pages[PageId(pid)]
            rec.consumers.add(node.node_id)
            rec.last_touch = now
            node.reads.add(rec.page_id)
        return {PageId(p) for p in pages}

    def _link_writes(self, task: Task, node: Node, refs: tuple[ev.PageRef, ...], version: int,
                     now: float) -> set[PageId]:
        touched = set()
        for ref in refs:
            pid = PageId(ref.page_id)
            rec = self._pages.get(pid)
            if rec is None:
                rec = self._pages[self._new_page(task, node.branch, pid, ref.state_type,
                                                 version, now)]
            else:  # a new version of the page (a retry rewrites it)
                task.branches[rec.branch].pages.discard(pid)
                task.branches[node.branch].pages.add(pid)
                rec.branch = node.branch
                rec.tag = TypeTag(state_type=ref.state_type, generation=task.generation)
                rec.version, rec.last_touch = version, now
                rec.cold_version, rec.audited = None, False
            rec.producers.add(node.node_id)
            node.writes.add(pid)
            touched.add(pid)
        return touched

    def _new_page(self, task: Task, branch: str, pid: PageId, state_type: StateType,
                  version: int, now: float) -> PageId:
        tag = TypeTag(state_type=state_type, generation=task.generation)
        self._pages[pid] = PageRecord(pid, tag, task.key, branch, version, now)
        task.branches[branch].pages.add(pid)
        return pid

    # ---- the version window ------------------------------------------------
    def _fold(self, task: Task) -> None:
        """Fold the oldest finished nodes beyond the window into the task's summary node."""
        excess = len(task.window) - self.policy.window
        if excess <= 0:
            return
        keep = []
        while task.window and excess > 0:
            nid = task.window.popleft()
            if self._nodes[nid].done:
                self._fold_node(task, self._nodes[nid])
                excess -= 1
            else:  # an unfinished call stays unrolled until it is done
                keep.append(nid)
        task.window.extendleft(reversed(keep))

    def _summary(self, task: Task) -> Node:
        if task.summary is None:
            node = Node(NodeId(self._next_node), NodeKind.SUMMARY, task.key, None, 0, True)
            self._next_node += 1
            self._nodes[node.node_id] = node
            self._succ[node.node_id], self._pred[node.node_id] = set(), set()
            task.summary = node.node_id
        return self._nodes[task.summary]

    def _fold_node(self, task: Task, node: Node) -> None:
        summary = self._summary(task)
        nid, sid = node.node_id, summary.node_id
        for pid in node.reads:
            consumers = self._pages[pid].consumers
            consumers.discard(nid)
            consumers.add(sid)
        for pid in node.writes:
            producers = self._pages[pid].producers
            producers.discard(nid)
            producers.add(sid)
        summary.reads |= node.reads
        summary.writes |= node.writes
        summary.version = max(summary.version, node.version)
        summary.folded += 1
        for pred in self._pred.pop(nid):
            self._succ[pred].discard(nid)
            self._add_control(pred, sid)
        for succ in self._succ.pop(nid):
            self._pred[succ].discard(nid)
            self._add_control(sid, succ)
        del self._nodes[nid]
        branch = task.branches[node.branch]
        branch.nodes -= 1
        for b in task.branches.values():
            if b.head == nid:
                b.head = sid
        if branch.status is BranchStatus.ABANDONED:
            self._prune_branches(task)
        if node.call_id is not None:
            del task.calls[node.call_id]

    def _prune_branches(self, task: Task) -> None:
        """Forget rolled-back branches once nothing unrolled or stored refers to them."""
        for name in [b.name for b in task.branches.values()
                     if b.status is BranchStatus.ABANDONED and b.nodes == 0 and not b.pages]:
            if not any(b.parent == name for b in task.branches.values()):
                del task.branches[name]

    # ---- queries ------------------------------------------------------------
    def _page(self, page: PageId) -> PageRecord:
        rec = self._pages.get(page)
        if rec is None:
            raise UnknownPage(f"page {page} is not in the event graph")
        return rec

    def _reachable(self, nid: NodeId) -> bool:
        """A consumer on a rolled-back branch will never run; a summary is kept conservatively."""
        node = self._nodes[nid]
        if node.branch is None:
            return True
        branch = self._tasks[node.task].branches.get(node.branch)
        return branch is not None and branch.status is not BranchStatus.ABANDONED

    def _in_live_context(self, rec: PageRecord) -> bool:
        if rec.task is None or not self._tasks[rec.task].open:
            return False
        branch = self._tasks[rec.task].branches[rec.branch]
        return (branch.status is BranchStatus.OPEN and not rec.tag.cold
                and rec.tag.state_type is not StateType.FAILED_BRANCH)

    def _rollback_needs(self, rec: PageRecord) -> bool:
        if not self.policy.keep_rollback_state or rec.task is None:
            return False
        task = self._tasks[rec.task]
        if not task.open:
            return False
        gone = rec.cold_version if rec.cold_version is not None else float("inf")
        return any(b.status is BranchStatus.OPEN and b.parent is not None
                   and rec.version <= b.fork_version < gone for b in task.branches.values())

    def blockers(self, page: PageId) -> frozenset[Blocker]:
        """Every reason the page cannot be retired now (empty: retirable)."""
        rec = self._page(page)
        out = set()
        if any(not self._nodes[c].done and self._reachable(c) for c in rec.consumers):
            out.add(Blocker.CONSUMER)
        if self._in_live_context(rec):
            out.add(Blocker.CONTEXT)
        if self._rollback_needs(rec):
            out.add(Blocker.ROLLBACK)
        if rec.tag.state_type in self.policy.audit_types and not rec.audited:
            out.add(Blocker.AUDIT)
        if rec.tag.state_type is StateType.FIXED_PREFIX and (not rec.tag.read_only or rec.users):
            out.add(Blocker.GENERATION)
        return frozenset(out)

    def is_retirable(self, page: PageId) -> bool:
        return not self.blockers(page)

    def dependency_strength(self, page: PageId) -> float:
        """D_i in [0, 1): 1 - 2^-(w*k), k = unfinished reachable consumers (+1 for the open
        task's next model call when in its live context, +open tasks on a prefix); w = 1 on
        the main branch, 0.5 on a speculative side branch."""
        rec = self._page(page)
        k = sum(1 for c in rec.consumers if not self._nodes[c].done and self._reachable(c))
        k += 1 if self._in_live_context(rec) else 0
        k += len(rec.users)
        weight = 1.0 if rec.branch in (None, ev.MAIN_BRANCH) else 0.5
        return 1.0 - 0.5 ** (weight * k)

    def record_audit_summary(self, page: PageId) -> None:
        """The audit summary (content hash, metadata) was written; the KV may now go."""
        self._page(page).audited = True

    def retire(self, page: PageId) -> None:
        """Forget a retirable page; raises ``PageStillNeeded`` (graph unchanged) otherwise."""
        blockers = self.blockers(page)
        if blockers:
            names = sorted(b.value for b in blockers)
            raise PageStillNeeded(f"page {page} is still needed: {names}")
        self._remove_page(page)

    def drop_page(self, page: PageId) -> bool:
        """Forget ``page`` whatever still blocks it: the last session holding it closed, so
        nothing can name it again. False if the graph does not hold it."""
        if page not in self._pages:
            return False
        self._remove_page(page)
        return True

    def _remove_page(self, page: PageId) -> None:
        rec = self._pages.pop(page)
        for nid in rec.producers | rec.consumers:
            self._nodes[nid].reads.discard(page)
            self._nodes[nid].writes.discard(page)
        if rec.task is None:
            for pages in self._prefixes.values():
                pages.discard(page)
        else:
            task = self._tasks[rec.task]
            task.branches[rec.branch].pages.discard(page)
            self._prune_branches(task)
            self._forget_if_finished(task)

    def _forget_if_finished(self, task: Task) -> None:
        """An ended task none of whose pages is left goes, with its nodes: nothing can read
        or retire through it any more. The graph used to keep every task it ever saw (its
        calls, observations and summary) for as long as it ran."""
        if task.open or any(b.pages for b in task.branches.values()):
            return
        nodes = [*task.window, *([task.summary] if task.summary is not None else [])]
        for nid in nodes:
            node = self._nodes.pop(nid)
            for pid in node.reads | node.writes:  # e.g. a shared prefix this task read
                rec = self._pages.get(pid)
                if rec is not None:
                    rec.consumers.discard(nid)
                    rec.producers.discard(nid)
            for other in self._succ.pop(nid, set()):
                self._pred.get(other, set()).discard(nid)
            for other in self._pred.pop(nid, set()):
                self._succ.get(other, set()).discard(nid)
        del self._tasks[task.key]

    def register_consumer(self, page: PageId, node: NodeId) -> None:
        """Declare a (candidate) consumer the events did not name."""
        rec, n = self._page(page), self._node(node)
        rec.consumers.add(n.node_id)
        n.reads.add(page)

    def register_producer(self, page: PageId, node: NodeId) -> None:
        rec, n = self._page(page), self._node(node)
        rec.producers.add(n.node_id)
        n.writes.add(page)

    def _node(self, node: NodeId) -> Node:
        n = self._nodes.get(node)
        if n is None:
            raise UnknownNode(f"node {node} is not in the event graph (folded or never made)")
        return n

    def node_for_call(self, tenant: str, session: str, task_id: str, call_id: str) -> NodeId:
        task = self._tasks.get((tenant, session, task_id))
        if task is None or call_id not in task.calls:
            raise UnknownNode(f"no unrolled node for call {call_id!r}")
        return task.calls[call_id]

    def page(self, page: PageId) -> PageInfo:
        rec = self._page(page)
        return PageInfo(page_id=rec.page_id, tag=rec.tag, task=rec.task, branch=rec.branch,
                        version=rec.version, last_touch=rec.last_touch,
                        producers=frozenset(rec.producers), consumers=frozenset(rec.consumers))

    def node(self, node: NodeId) -> NodeInfo:
        n = self._node(node)
        return NodeInfo(node_id=n.node_id, kind=n.kind, task=n.task, branch=n.branch,
                        version=n.version, done=n.done, call_id=n.call_id,
                        successors=frozenset(self._succ[node]), folded=n.folded)

    def page_ids(self) -> frozenset[PageId]:
        return frozenset(self._pages)

    def node_ids(self) -> frozenset[NodeId]:
        return frozenset(self._nodes)

    def edges(self, kind: EdgeKind) -> frozenset[tuple[NodeId, NodeId]]:
        """Distinct (src, dst) pairs: execution order, or producer -> consumer via a page."""
        if kind is EdgeKind.CONTROL:
            return frozenset((src, dst) for src, dsts in self._succ.items() for dst in dsts)
        return frozenset((src, dst) for rec in self._pages.values() for src in rec.producers
                         for dst in rec.consumers if src != dst)

    def current_generation(self, tenant: str) -> int:
        return self._generations.get(tenant, 0)

    def stats(self) -> GraphStats:
        return GraphStats(
            tasks=len(self._tasks),
            nodes=len(self._nodes),
            summary_nodes=sum(1 for n in self._nodes.values() if n.kind is NodeKind.SUMMARY),
            control_edges=sum(len(s) for s in self._succ.values()),
            data_edges=len(self.edges(EdgeKind.DATA)),
            pages=len(self._pages),
            branches=sum(len(t.branches) for t in self._tasks.values()),
        )


__all__ = ["GraphBase", "PageStillNeeded", "UnknownNode"]
