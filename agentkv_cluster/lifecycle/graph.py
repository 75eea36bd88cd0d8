"""Event graph (§2.1): nodes, data/control edges, per-page producers and consumers.

Every ``apply`` validates the whole event against the graph before it changes
anything, so a rejected event leaves the graph exactly as it was. Loops are
unrolled over a bounded window of nodes per task; older finished nodes fold
into one conservative summary node per task (it keeps every page reference and
edge of what it replaced), so a 100k-iteration retry loop stays bounded.
"""

from __future__ import annotations

from agentkv_cluster.lifecycle import events as ev
from agentkv_cluster.lifecycle.graph_base import GraphBase
from agentkv_cluster.lifecycle.graph_records import (
    Branch,
    BranchStatus,
    NodeKind,
    PageRecord,
    RetentionPolicy,
    Task,
    TaskKey,
)
from agentkv_cluster.lifecycle.types import (
    FAILABLE_TYPES,
    PageId,
    Reuse,
    StateType,
    TypeSignal,
    TypeTag,
    retype,
    reuse_for,
)


class EventGraph(GraphBase):
    """The lifecycle graph of every task the controller sees (pure; time passed in)."""

    def __init__(self, policy: RetentionPolicy | None = None) -> None:
        super().__init__(policy or RetentionPolicy())
        self._versions: dict[tuple[str, str], int] = {}

    def apply(self, event: ev.Event, now: float) -> frozenset[PageId]:
        """Apply one event; returns the pages it touched (what the planner replans)."""
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise ev.UnknownEventKind(f"not an event: {type(event).__name__}")
        ev.check_header(event)
        skey = (event.tenant, event.session)
        last = self._versions.get(skey)
        if last is not None and event.version <= last:
            raise ev.OutOfOrderVersion(
                f"session {event.session}: version {event.version} after {last}"
            )
        touched = handler(self, event, now)
        self._versions[skey] = event.version
        return frozenset(touched)

    def last_version(self, tenant: str, session: str) -> int | None:
        return self._versions.get((tenant, session))

    def forget_tenant(self, tenant: str) -> int:
        """Tenant erasure: drop every task, node, page, prefix and event version of
        ``tenant``, whatever still needs them (the tenant is gone; a tenant created again
        under the name starts empty). Returns how many pages were dropped."""
        tasks = {k for k in self._tasks if k[0] == tenant}
        pages = {p for p, rec in self._pages.items() if rec.task in tasks}
        pages |= self._prefixes.pop(tenant, set())
        for nid in [n for n, node in self._nodes.items() if node.task in tasks]:
            del self._nodes[nid]
            for other in self._succ.pop(nid, set()):
                self._pred.get(other, set()).discard(nid)
            for other in self._pred.pop(nid, set()):
                self._succ.get(other, set()).discard(nid)
        for page in pages:
            self._pages.pop(page, None)
        for key in tasks:
            del self._tasks[key]
        self._generations.pop(tenant, None)
        for key in [k for k in self._versions if k[0] == tenant]:
            del self._versions[key]
        return len(pages)

    def end_session(self, tenant: str, session: str) -> int:
        """The session closed: each of its open tasks ends as its ``TaskEnd`` would, and
        its event versions go (opened again, the session starts afresh). Returns how many
        tasks it ended. An ended task goes with its last page (``retire``, ``drop_page``)."""
        tasks = [t for k, t in self._tasks.items() if k[:2] == (tenant, session) and t.open]
        for task in tasks:
            self._end_task(task)
        self._versions.pop((tenant, session), None)
        return len(tasks)

    # ---- checks (raise before any change) --------------------------------
    def _open_task(self, e: ev.Event) -> Task:
        task = self._tasks.get((e.tenant, e.session, e.task_id))
        if task is None:
            raise ev.UnknownReference(f"unknown task {e.task_id!r} in session {e.session!r}")
        if not task.open:
            raise ev.ConflictingEvent(f"task {e.task_id!r} has ended")
        return task

    @staticmethod
    def _open_branch(task: Task, name: str) -> Branch:
        branch = task.branches.get(name)
        if branch is None:
            raise ev.UnknownReference(f"unknown branch {name!r} in task {task.key[2]!r}")
        if branch.status is not BranchStatus.OPEN:
            raise ev.ConflictingEvent(f"branch {name!r} is {branch.status.value}")
        return branch

    def _check_reads(self, task: Task, pages: tuple[int, ...]) -> None:
        for pid in pages:
            rec = self._known(pid)
            if rec.task is None:
                self._check_prefix_tenant(task.key[0], rec.page_id)
            elif rec.task != task.key:
                raise ev.ConflictingEvent(f"page {pid} belongs to another task")
            if reuse_for(rec.tag, task_generation=task.generation) is Reuse.REFUSED:
                raise ev.ConflictingEvent(
                    f"prefix page {pid} (generation {rec.tag.generation}) is not reusable "
                    f"by a task of generation {task.generation}"
                )

    def _check_writes(self, task: Task, refs: tuple[ev.PageRef, ...]) -> None:
        for ref in refs:
            rec = self._pages.get(PageId(ref.page_id))
            if ref.state_type is StateType.FIXED_PREFIX:
                raise ev.ConflictingEvent("fixed prefix pages are declared by TaskStart only")
            if rec is not None and rec.task is None:
                raise ev.ConflictingEvent(f"page {ref.page_id} is a shared prefix: read-only")
            if rec is not None and rec.task != task.key:
                raise ev.ConflictingEvent(f"page {ref.page_id} belongs to another task")

    def _check_prefix_tenant(self, tenant: str, pid: PageId) -> None:
        if pid not in self._prefixes.get(tenant, ()):
            raise ev.ConflictingEvent(f"prefix page {pid} belongs to another tenant")

    def _known(self, pid: int) -> PageRecord:
        rec = self._pages.get(PageId(pid))
        if rec is None:
            raise ev.UnknownReference(f"unknown page {pid}")
        return rec

    # ---- handlers: check everything, then mutate --------------------------
    def _task_start(self, e: ev.TaskStart, now: float) -> set[PageId]:
        key = (e.tenant, e.session, e.task_id)
        if key in self._tasks:
            raise ev.ConflictingEvent(f"task {e.task_id!r} already started")
        current = self._generations.get(e.tenant, 0)
        gen = e.prefix_generation
        if gen < current:
            raise ev.ConflictingEvent(f"prefix generation {gen} is older than {current}")
        for pid in e.prefix_pages:
            rec = self._pages.get(PageId(pid))
            if rec is None:
                continue
            if rec.task is None:
                self._check_prefix_tenant(e.tenant, rec.page_id)
            if rec.tag.state_type is not StateType.FIXED_PREFIX or rec.tag.generation != gen:
                raise ev.ConflictingEvent(
                    f"page {pid} is not a generation-{gen} prefix; new tasks never reuse "
                    "an older generation"
                )
        for pid in e.input_pages:
            if PageId(pid) in self._pages or pid in e.prefix_pages:
                raise ev.ConflictingEvent(f"task input page {pid} already exists")
        touched: set[PageId] = set()
        if gen > current:
            touched |= self._bump_generation(e.tenant, gen)
        task = Task(key=key, generation=gen, prefix_pages=tuple(PageId(p) for p in e.prefix_pages))
        task.branches[ev.MAIN_BRANCH] = Branch(ev.MAIN_BRANCH, None, e.version, None)
        self._tasks[key] = task
        for pid in task.prefix_pages:
            rec = self._pages.get(pid)
            if rec is None:
                rec = PageRecord(pid, TypeTag(state_type=StateType.FIXED_PREFIX, generation=gen),
                                 None, None, e.version, now)
                self._pages[pid] = rec
                self._prefixes.setdefault(e.tenant, set()).add(pid)
            rec.users.add(key)
            rec.last_touch = now
            touched.add(pid)
        for pid in e.input_pages:
            touched.add(self._new_page(task, ev.MAIN_BRANCH, PageId(pid),
                                       StateType.TASK_INPUT, e.version, now))
        return touched

    def _bump_generation(self, tenant: str, gen: int) -> set[PageId]:
        self._generations[tenant] = gen
        touched = set()
        for pid in self._prefixes.get(tenant, ()):
            rec = self._pages[pid]
            if not rec.tag.read_only:
                rec.tag = retype(rec.tag, TypeSignal.PREFIX_VERSION_BUMP)
                touched.add(pid)
        return touched

    def _model_call(self, e: ev.ModelCall, now: float) -> set[PageId]:
        return self._start_call(e, NodeKind.MODEL_CALL, e.produces, now)

    def _tool_start(self, e: ev.ToolStart, now: float) -> set[PageId]:
        return self._start_call(e, NodeKind.TOOL_CALL, (), now)

    def _start_call(self, e: ev.ModelCall | ev.ToolStart, kind: NodeKind,
                    produces: tuple[ev.PageRef, ...], now: float) -> set[PageId]:
        """A model call or tool start: a new open node reading ``consumes``, writing ``produces``."""
        task = self._open_task(e)
        self._open_branch(task, e.branch)
        self._check_new_call(task, e.call_id)
        self._check_reads(task, e.consumes)
        self._check_writes(task, produces)
        node = self._add_node(task, e.branch, kind, e.version, done=False)
        task.calls[e.call_id] = node.node_id
        node.call_id = e.call_id
        touched = self._link_reads(node, e.consumes, now)
        touched |= self._link_writes(task, node, produces, e.version, now)
        self._fold(task)
        return touched

    def _observation(self, e: ev.ObservationReturn, now: float) -> set[PageId]:
        task = self._open_task(e)
        tool = self._nodes.get(task.calls.get(e.call_id, -1))  # type: ignore[arg-type]
        if tool is None or tool.kind is not NodeKind.TOOL_CALL:
            raise ev.UnknownReference(f"no tool call {e.call_id!r} in task {e.task_id!r}")
        if tool.done:
            raise ev.ConflictingEvent(f"tool call {e.call_id!r} already returned")
        self._check_writes(task, e.produces)
        for pid in e.supersedes:
            rec = self._known(pid)
            if rec.task != task.key or rec.tag.state_type is not StateType.TOOL_OBSERVATION:
                raise ev.ConflictingEvent(f"page {pid} is not a tool observation of this task")
        tool.done = True
        branch: str = tool.branch  # type: ignore[assignment]  # a tool node always has one
        obs = self._add_node(task, branch, NodeKind.OBSERVATION, e.version, done=True)
        self._add_control(tool.node_id, obs.node_id)
        touched = self._link_writes(task, obs, e.produces, e.version, now)
        for pid in e.supersedes:
            rec = self._pages[PageId(pid)]
            if not rec.tag.cold:
                rec.tag = retype(rec.tag, TypeSignal.SUPERSEDED)
                rec.cold_version = e.version
            touched.add(rec.page_id)
        if task.branches[branch].status is BranchStatus.ABANDONED:
            self._fail_pages(task.branches[branch], touched)
        self._fold(task)
        return touched

    def _branch_create(self, e: ev.BranchCreate, now: float) -> set[PageId]:
        task = self._open_task(e)
        parent = self._open_branch(task, e.parent)
        if e.branch in task.branches:
            raise ev.ConflictingEvent(f"branch {e.branch!r} already exists")
        task.branches[e.branch] = Branch(e.branch, e.parent, e.version, parent.head)
        return set()

    def _verification(self, e: ev.VerificationPass, now: float) -> set[PageId]:
        task = self._open_task(e)
        self._open_branch(task, e.branch)
        self._check_new_call(task, e.call_id)
        for pid in e.pages:
            rec = self._known(pid)
            if rec.task != task.key or rec.tag.state_type is not StateType.TEMP_REASONING:
                raise ev.ConflictingEvent(f"page {pid} is not temporary reasoning of this task")
        node = self._add_node(task, e.branch, NodeKind.VERIFICATION, e.version, done=True)
        task.calls[e.call_id] = node.node_id
        node.call_id = e.call_id
        touched = self._link_reads(node, e.pages, now)
        for pid in e.pages:
            rec = self._pages[PageId(pid)]
            rec.tag = retype(rec.tag, TypeSignal.VERIFIED)
        self._fold(task)
        return touched

    def _rollback(self, e: ev.Rollback, now: float) -> set[PageId]:
        task = self._open_task(e)
        if e.branch == ev.MAIN_BRANCH:
            raise ev.ConflictingEvent("the main branch cannot be rolled back")
        self._open_branch(task, e.branch)
        touched: set[PageId] = set()
        doomed, gone = [e.branch], set()
        while doomed:  # a rolled-back branch takes its open descendants with it
            branch = task.branches[doomed.pop()]
            branch.status = BranchStatus.ABANDONED
            gone.add(branch.name)
            self._fail_pages(branch, touched)
            doomed += [b.name for b in task.branches.values()
                       if b.parent == branch.name and b.status is BranchStatus.OPEN]
        for nid in task.window:  # its model calls stop; its tools may still return
            node = self._nodes[nid]
            if node.branch in gone and node.kind is NodeKind.MODEL_CALL:
                node.done = True
        self._fold(task)
        self._prune_branches(task)
        return touched

    def _task_end(self, e: ev.TaskEnd, now: float) -> set[PageId]:
        return self._end_task(self._open_task(e))

    def _end_task(self, task: Task) -> set[PageId]:
        task.open = False
        for branch in task.branches.values():
            if branch.status is BranchStatus.OPEN:
                branch.status = BranchStatus.CLOSED
        for nid in task.window:  # unfinished calls of an ended task are cancelled
            self._nodes[nid].done = True
        touched = set(task.prefix_pages)
        for pid in task.prefix_pages:
            rec = self._pages.get(pid)
            if rec is not None:
                rec.users.discard(task.key)
        for branch in task.branches.values():
            touched |= branch.pages
        self._fold(task)
        self._forget_if_finished(task)
        return touched

    def _fail_pages(self, branch: Branch, touched: set[PageId]) -> None:
        for pid in branch.pages:
            rec = self._pages[pid]
            if rec.tag.state_type in FAILABLE_TYPES:
                rec.tag = retype(rec.tag, TypeSignal.BRANCH_FAILED)
            touched.add(pid)

    def _check_new_call(self, task: Task, call_id: str) -> None:
        if call_id in task.calls:
            raise ev.ConflictingEvent(f"call {call_id!r} already exists in task {task.key[2]!r}")


_HANDLERS = {
    ev.TaskStart: EventGraph._task_start,
    ev.ModelCall: EventGraph._model_call,
    ev.ToolStart: EventGraph._tool_start,
    ev.ObservationReturn: EventGraph._observation,
    ev.BranchCreate: EventGraph._branch_create,
    ev.VerificationPass: EventGraph._verification,
    ev.Rollback: EventGraph._rollback,
    ev.TaskEnd: EventGraph._task_end,
}

__all__ = ["EventGraph", "RetentionPolicy", "TaskKey"]
