"""The worker's block writer: block copies gathered from vLLM's cache, written to the
backend by one background thread, in the order they were queued.

vLLM never waits for a store write: a full queue skips the save (``save_dropped``, a
later miss). A block queued and not yet written is served to loads from memory
(``queued``). Finished requests whose blocks vLLM holds for the connector are released
(``take_released``, reported by ``get_finished``) as soon as their blocks are copied out,
or, with a *barrier*, only once every save queued before them is written: the release of
the request that carries its session's ``task_end`` or ``branch_abandoned``
(``retiring.py``), so the retire (embedded store) or the close (service) comes after the
session's last saves. A barrier with nothing to free (vLLM holds that request's blocks
itself) is only reported passed (``take_passed``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from agentkv_cluster.engines.vllm.backend import BlockBackend, ConnectorCounters
from agentkv_cluster.engines.vllm.blocks import BlockGeometry, seal_block
from agentkv_cluster.lifecycle.identity import PageIdentity

log = logging.getLogger(__name__)
_STOP = object()


@dataclass(frozen=True, slots=True)
class _Barrier:
    req_id: str  # released once the writer reaches it
    free: bool  # vLLM frees the request's blocks then (False: only reported passed)


class BlockWriter:
    def __init__(self, backend: BlockBackend, counters: ConnectorCounters,
                 save_queue: int = 256) -> None:
        self.backend = backend
        self.counters = counters
        self.geometry: BlockGeometry | None = None  # set when vLLM registers its KV cache
        self.lock = threading.Lock()  # also the worker's for its load bookkeeping
        self._pending: dict[bytes, torch.Tensor] = {}  # queued saves, servable before written
        self._failed: set[bytes] = set()
        self._released: set[str] = set()
        self._passed: set[str] = set()
        self._barriers: list[_Barrier] = []  # not queued yet: the queue was full
        self._warned = False
        self._queue: queue.Queue = queue.Queue(maxsize=save_queue)
        self._thread = threading.Thread(target=self._loop, name="agentkv-save", daemon=True)
        self._thread.start()

    def queued(self, digest: bytes) -> torch.Tensor | None:
        with self.lock:
            return self._pending.get(digest)

    def submit(self, caller: Any, identity: PageIdentity, host: torch.Tensor) -> None:
        """Queue ``host`` (the block's copy) to be written; a full queue skips it."""
        digest = identity.digest()
        with self.lock:
            self._pending[digest] = host
        try:
            self._queue.put_nowait((caller, identity, host))
        except queue.Full:
            self.counters.add(save_dropped=1)
            with self.lock:
                self._pending.pop(digest, None)
                self._failed.add(digest)

    def skipped(self, identity: PageIdentity) -> None:
        """A save planned and not made: the scheduler stops matching it (``take_failed``)."""
        with self.lock:
            self._failed.add(identity.digest())

    def release(self, req_id: str, *, barrier: bool, free: bool = True) -> None:
        """vLLM may free ``req_id``'s blocks now, or with ``barrier`` once every save
        queued before this call is written; ``free=False``: vLLM holds none of them for
        the connector, the barrier is only reported passed."""
        if barrier:
            self._barriers.append(_Barrier(req_id, free))
            self._queue_barriers()
        else:
            self._reached(_Barrier(req_id, free))

    def _reached(self, barrier: _Barrier) -> None:
        with self.lock:
            (self._released if barrier.free else self._passed).add(barrier.req_id)

    def _queue_barriers(self) -> None:
        while self._barriers:
            try:
                self._queue.put_nowait(self._barriers[0])
            except queue.Full:
                return  # tried again at the next take_released
            self._barriers.pop(0)

    def take_released(self) -> set[str]:
        self._queue_barriers()
        with self.lock:
            released, self._released = self._released, set()
        return released

    def take_passed(self) -> set[str]:
        """Barriers without a release the writer reached since the last call."""
        self._queue_barriers()
        with self.lock:
            passed, self._passed = self._passed, set()
        return passed

    def take_failed(self) -> set[bytes]:
        """Digests of blocks not saved (queue full, or the write failed)."""
        with self.lock:
            failed, self._failed = self._failed, set()
        return failed

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if isinstance(item, _Barrier):
                    self._reached(item)
                    continue
                self.write(*item)
            finally:
                self._queue.task_done()

    def write(self, caller: Any, identity: PageIdentity, host: torch.Tensor) -> None:
        """Seal and write one block now (on the calling thread); a failure is counted,
        logged once per outage, and the block is a later miss."""
        t0 = time.perf_counter()
        try:
            assert self.geometry is not None, "no KV cache registered"
            page = seal_block(identity, self.geometry,
                              host.contiguous().view(torch.uint8).numpy())
            self.backend.put(caller, identity, page)
            self.counters.add(saved_blocks=1, write_us=int((time.perf_counter() - t0) * 1e6))
            self._warned = False
        except Exception as exc:  # noqa: BLE001 - a failed save is a later miss, nothing more
            self.counters.add(save_failures=1)
            with self.lock:
                self._failed.add(identity.digest())
            if not self._warned:  # once per outage, not once per block
                log.warning("AgentKV: saving blocks failed: %s", exc)
                self._warned = True
        finally:
            with self.lock:
                self._pending.pop(identity.digest(), None)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued save is written; False on timeout."""
        end = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def close(self) -> None:
        try:
            self._queue.put(_STOP, timeout=5.0)
        except queue.Full:
            pass
        self._thread.join(10.0)
