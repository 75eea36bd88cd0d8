"""What the scheduler-side connector hands the worker-side one each step (plain records,
picklable: with a multi-process executor they cross a process boundary)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentkv_cluster.engines.vllm.backend import Caller
from agentkv_cluster.engines.vllm.hints import HintEvent
from agentkv_cluster.lifecycle.identity import PageIdentity

try:  # the base classes only where vLLM is installed (the pure parts import without it)
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorMetadata,
        KVConnectorWorkerMetadata,
    )
except ImportError:  # pragma: no cover - exercised only without vLLM
    KVConnectorMetadata = object  # type: ignore[misc,assignment]
    KVConnectorWorkerMetadata = object  # type: ignore[misc,assignment]


@dataclass(frozen=True, slots=True)
class BlockOp:
    identity: PageIdentity
    block_id: int  # vLLM's physical block id for this step


@dataclass(frozen=True, slots=True)
class RequestOps:
    req_id: str
    caller: Caller
    loads: tuple[BlockOp, ...] = ()  # in token order: a failed block fails all after it
    saves: tuple[BlockOp, ...] = ()
    tail: bool = False  # the last load is a partial block: the forward writes the rest
    async_load: bool = False  # load off the step; done when get_finished reports req_id
    release: bool = False  # vLLM holds the finished request's blocks until these saves
    # ... and until every save queued before them is written; without ``release`` (vLLM
    # holds the blocks itself) the barrier's passing is reported in AgentKVWorkerMeta
    barrier: bool = False
    unrestored: tuple[int, ...] = ()  # blocks vLLM counts restored that no load fills


@dataclass(frozen=True, slots=True)
class FailedLoad:
    """A request's tokens a worker could not restore, and the worker's step (its count of
    steps begun) whose load failed: the scheduler echoes the latest it read in
    ``AgentKVConnectorMetadata.failures_seen``."""

    tokens: int
    step: int


@dataclass
class AgentKVConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    requests: list[RequestOps] = field(default_factory=list)
    events: list[tuple[Caller, HintEvent]] = field(default_factory=list)
    outages: int = 0  # service backend: failures the scheduler saw (the worker forgets)
    # the latest failed load (``FailedLoad.step``) the scheduler had read when it planned
    # this step: a worker skips every save of a step planned before it read one (any
    # request may have read the failed blocks: a prefix-cache hit on them, async scheduling)
    failures_seen: int = 0


@dataclass
class AgentKVWorkerMeta(KVConnectorWorkerMetadata):  # type: ignore[misc]
    """Worker -> scheduler: block digests no longer held (the directory mirror forgets them),
    per request the tokens whose load failed (recomputed by vLLM) and the first token of
    the saves it skipped (``failures_seen``: planned again), and the requests whose
    barrier without a release passed (every save queued before it is written), with how
    many workers report that: with tensor or pipeline parallelism each worker writes its
    own part of the blocks, and the barrier has passed once every worker has reported it,
    in this step or an earlier one (``BarrierReports``)."""

    dropped: set[bytes] = field(default_factory=set)
    failed_loads: dict[str, FailedLoad] = field(default_factory=dict)
    passed: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)  # req -> first token of a save skipped

    def aggregate(self, other: AgentKVWorkerMeta) -> AgentKVWorkerMeta:
        failed = dict(self.failed_loads)
        for req, f in other.failed_loads.items():  # every worker saw the same request fail
            mine = failed.get(req, f)
            failed[req] = FailedLoad(max(f.tokens, mine.tokens), max(f.step, mine.step))
        passed = dict(self.passed)
        for req, n in other.passed.items():
            passed[req] = passed.get(req, 0) + n
        skipped = dict(self.skipped)
        for req, start in other.skipped.items():
            skipped[req] = min(start, skipped.get(req, start))
        return AgentKVWorkerMeta(self.dropped | other.dropped, failed, passed, skipped)


class BarrierReports:
    """The scheduler's count of the workers that reported each barrier passed: vLLM merges
    one step's worker metadata, and a worker whose writes lag reports in a later step (at
    the first report the barrier counted as passed while other workers' saves were still
    queued). The way vLLM counts ``finished_sending`` across workers."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self._seen: dict[str, int] = {}

    def passed(self, reports: dict[str, int]) -> set[str]:
        """The barriers every worker has now reported (each is forgotten then)."""
        done = set()
        for req, n in reports.items():
            seen = self._seen.get(req, 0) + n
            if seen >= self.workers:
                self._seen.pop(req, None)
                done.add(req)
            else:
                self._seen[req] = seen
        return done
