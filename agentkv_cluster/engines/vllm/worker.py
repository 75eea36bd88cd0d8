"""Worker side of the connector: moves KV bytes between vLLM's paged cache and the backend.

vLLM's per-layer KV tensors put blocks at dim 0 (``[num_blocks, ...]``, the standardised
layout of vLLM >= 0.32), so a block of one layer is ``kv[block_id]`` whatever the
attention backend stores inside it; a block page is those slices of every layer, in
layer order, at full precision. A backend that splits vLLM's block into smaller kernel
blocks has one row per kernel block: ``layout.block_views`` groups them per vLLM block.

- Loads start when vLLM binds the step's metadata, before the forward. Asynchronous
  ones (the request waits in vLLM's ``WAITING_FOR_REMOTE_KVS`` while the others run) go
  to the loader thread and are reported done by ``get_finished``. Loads the step's
  forward reads run on a step thread, layer by layer: the forward waits in
  ``wait_for_layer_load`` only for a layer not copied yet. A partly filled block (a
  tail) is copied before the forward instead: the forward writes this step's tokens into
  the rest of that block before it waits for the layer, and a copy after would overwrite
  them. Every block is read and checked before any of its layers is written; a block
  that is missing, damaged or of another identity stops the request's load there: it and
  every later block are reported through ``get_block_ids_with_load_errors`` and vLLM
  recomputes them (the connector sets ``kv_load_failure_policy="recompute"``); the
  request's saves of that step from there on are dropped (computed on blocks not
  restored), and so is every other save of the steps planned before the scheduler read
  the failure (``failures_seen``): another request may have read the failed blocks (a
  prefix-cache hit on them), and async scheduling plans a step ahead. The scheduler plans
  the skipped saves again (vLLM recomputes the failed request's blocks), and never saves
  again a request that holds a failed block.
- Saves are gathered in ``wait_for_save`` (after the forward wrote the step's KV) into
  host memory, then written by a background thread (``writer.py``), so vLLM frees or
  reuses the blocks at once and never waits for the store; a full queue skips the save
  (a counted miss).
  A finished request's partly filled last block (its tail) is gathered the same way
  while vLLM holds the request's blocks; ``get_finished`` then releases them (the
  request that carries its session's close: once every save queued before is written).
- Between steps the loader thread also runs the embedded store's prefetch (a paused
  session's blocks back to the host pool before its tool is predicted to return).

On a CUDA device the gather is a device-to-host copy and the scatter a host-to-device one;
nothing else differs.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import replace

import torch

from agentkv_cluster.engines.vllm.backend import (
    BackendUnavailable,
    BlockBackend,
    CallerRefused,
    ConnectorCounters,
)
from agentkv_cluster.engines.vllm.blocks import (
    BlockGeometry,
    BlockMismatch,
    open_block,
)
from agentkv_cluster.engines.vllm.layout import ordered_layers
from agentkv_cluster.engines.vllm.meta import (
    AgentKVConnectorMetadata,
    BlockOp,
    FailedLoad,
    RequestOps,
)
from agentkv_cluster.engines.vllm.writer import BlockWriter

log = logging.getLogger(__name__)
_STOP = object()
_PREFETCH = object()


class WorkerSide:
    def __init__(self, backend: BlockBackend, counters: ConnectorCounters,
                 save_queue: int = 256, background: bool | None = None) -> None:
        self.backend = backend
        self.counters = counters
        # copies and writes on threads next to the forward (None: where the KV cache is on
        # an accelerator), or between forwards on vLLM's thread: on a CPU-only engine the
        # forward's OpenMP threads hold every core, and work beside them slows it down
        self.background = background
        self.layers: list[torch.Tensor] = []
        self.geometry: BlockGeometry | None = None
        self._errors: set[int] = set()
        self.writer = BlockWriter(backend, counters, save_queue)
        self._pending_lock = self.writer.lock
        self._failed: dict[str, set[BlockOp]] = {}  # req id -> its loads that failed
        self._steps = 0  # steps begun: a failure's step (FailedLoad.step)
        self._failed_at = 0  # the step of the latest failed load
        self._skipped: dict[str, int] = {}  # req id -> first token of a save skipped
        self._names: dict[str, int] = {}
        self._begun: AgentKVConnectorMetadata | None = None
        self._step_loader: threading.Thread | None = None
        self._layer_done: list[threading.Event] = []
        self._recved: set[str] = set()  # async loads done, for get_finished
        self._jobs: queue.Queue = queue.Queue()  # async loads and prefetches
        self._loader = threading.Thread(target=self._load_loop, name="agentkv-load",
                                        daemon=True)
        self._loader.start()

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """``kv_caches``: one tensor per layer with vLLM's blocks at dim 0
        (``layout.block_views``)."""
        names, self.layers, self.geometry = ordered_layers(kv_caches)
        self._names = {n: i for i, n in enumerate(names)}
        first = self.layers[0]
        if self.background is None:
            self.background = first.device.type != "cpu"
        self.writer.geometry = self.geometry
        log.info("AgentKV: %d KV layers, block %s %s, %d blocks on %s", len(self.layers),
                 self.geometry.per_layer, self.geometry.dtype, first.shape[0], first.device)

    # -- loads ------------------------------------------------------------------------
    def begin_step(self, meta: AgentKVConnectorMetadata) -> None:
        """Start this step's loads (called when vLLM binds the step's metadata, before the
        forward): asynchronous ones on the loader thread (reported by ``get_finished``);
        those the forward reads (``async_load=False``) on a step thread, layer by layer,
        so the forward only waits for a layer not copied yet (``wait_layer``)."""
        if meta is self._begun:
            return
        self._begun = meta
        self._steps += 1
        t0 = time.perf_counter()
        try:
            self._begin(meta)
        finally:
            self.counters.add(step_wait_us=int((time.perf_counter() - t0) * 1e6))

    def _begin(self, meta: AgentKVConnectorMetadata) -> None:
        sync = getattr(self.backend, "peer_outages", None)  # the service backend
        if sync is not None:  # before this step's saves ask what it holds
            sync(meta.outages)
        claim = getattr(self.backend, "claim", None)  # the embedded store: the blocks this
        for req in meta.requests if claim is not None else ():  # step reads or finds held
            if req.loads or req.saves:  # stay when an event below retires another session
                claim(req.caller, [op.identity for op in (*req.loads, *req.saves)])
        for caller, event in meta.events:
            try:
                self.backend.event(caller, event)
            except (BackendUnavailable, CallerRefused, ValueError) as exc:
                log.warning("AgentKV: event %s not applied: %s", event.kind.value, exc)
        now = [req for req in meta.requests if req.loads and not req.async_load]
        for req in meta.requests:
            if req.unrestored:  # the scheduler could not plan these: vLLM recomputes them
                with self._pending_lock:
                    self._errors.update(req.unrestored)
                    if req.async_load:
                        self._recved.add(req.req_id)
            if req.loads and req.async_load:
                self.counters.add(async_loads=1)
                if self.background:
                    self._jobs.put(req)
                else:  # between forwards; vLLM still schedules it a step later
                    self._load_safe(req)
                    with self._pending_lock:
                        self._recved.add(req.req_id)
        if now and self.background:
            now = [self._tail_first(req) for req in now]
            self._layer_done = [threading.Event() for _ in self.layers]
            self._step_loader = threading.Thread(target=self._load_layerwise, args=(now,),
                                                 name="agentkv-step-load", daemon=True)
            self._step_loader.start()
        for req in now if not self.background else ():
            self._load_safe(req)
        if getattr(self.backend, "prefetch_due", None) is not None:
            if not self.background:
                self._prefetch()
            elif self._jobs.empty():
                self._jobs.put(_PREFETCH)  # tool returns predicted soon: host pool, off the step

    def _tail_first(self, req: RequestOps) -> RequestOps:
        """Copy ``req``'s tail now, before the forward writes this step's tokens into the
        rest of its block (before it waits for the layer); the rest of ``req``'s loads."""
        if not req.tail:
            return req
        self._load_safe(replace(req, loads=req.loads[-1:]))
        return replace(req, loads=req.loads[:-1], tail=False)

    def wait_layer(self, index: int) -> None:
        """Block until layer ``index`` of this step's loads is in vLLM's cache."""
        if self._step_loader is not None:
            t0 = time.perf_counter()
            self._layer_done[index].wait()
            self.counters.add(step_wait_us=int((time.perf_counter() - t0) * 1e6))

    def finish_loads(self) -> None:
        """End of the step: this step's loads are complete (and their errors recorded)."""
        if self._step_loader is not None:
            t0 = time.perf_counter()
            self._step_loader.join()
            self._step_loader = None
            self.counters.add(step_wait_us=int((time.perf_counter() - t0) * 1e6))

    def start_load_kv(self, meta: AgentKVConnectorMetadata) -> None:
        """Start and complete this step's loads (asynchronous ones keep running)."""
        self.begin_step(meta)
        self.finish_loads()

    def layer_index(self, name: str) -> int | None:
        return self._names.get(name)

    def _load_layerwise(self, reqs: list[RequestOps]) -> None:
        """Read and check every block first (a bad block is never written), then copy
        layer by layer, releasing the forward's wait for each layer as it lands."""
        try:
            ready: list[tuple[int, torch.Tensor]] = []
            for req in reqs:
                try:
                    ready.extend(self._fetch(req))
                except Exception:  # never into vLLM's step: those blocks are recomputed
                    log.exception("AgentKV: loading for %s failed; recomputing", req.req_id)
                    self._fail(req, 0)
            t0 = time.perf_counter()
            try:
                for i, kv in enumerate(self.layers):
                    for block_id, host in ready:
                        kv[block_id].copy_(host[i])
                    if kv.is_cuda:  # in vLLM's cache before the forward (its own stream)
                        torch.cuda.current_stream(kv.device).synchronize()  # reads it
                    self._layer_done[i].set()
            except Exception:  # a half-copied block is recomputed
                log.exception("AgentKV: copying restored blocks failed; recomputing")
                for req in reqs:
                    self._fail(req, 0)
            self.counters.add(load_us=int((time.perf_counter() - t0) * 1e6))
        finally:
            for ev in self._layer_done:
                ev.set()

    def _load_safe(self, req: RequestOps) -> None:
        try:
            self._load(req)
        except Exception:  # never into vLLM's step: those blocks are recomputed
            log.exception("AgentKV: loading for %s failed; recomputing", req.req_id)
            self._fail(req, 0)

    def _load_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            if job is _PREFETCH:
                self._prefetch()
                continue
            self._load_safe(job)
            with self._pending_lock:  # errors (if any) are recorded before this
                self._recved.add(job.req_id)

    def _prefetch(self) -> None:
        try:
            self.counters.add(prefetched_blocks=self.backend.prefetch_due())
        except Exception:  # a prefetch is only an optimisation
            log.exception("AgentKV: prefetch failed")

    def get_finished(self) -> tuple[set[str] | None, set[str] | None]:
        """(saves done, loads done) of requests vLLM handed over asynchronously."""
        sent = self.writer.take_released()
        with self._pending_lock:
            recved, self._recved = self._recved, set()
        return sent or None, recved or None

    def _load(self, req: RequestOps) -> None:
        """Read, check and copy ``req``'s blocks (the loader thread: async loads)."""
        for block_id, host in self._fetch(req):
            self._scatter_host(block_id, host)

    def _fetch(self, req: RequestOps) -> list[tuple[int, torch.Tensor]]:
        """The checked block contents to copy, in token order, up to the first block that
        is gone or does not check (it and every later one are recomputed)."""
        assert self.geometry is not None
        t0 = time.perf_counter()
        out: list[tuple[int, torch.Tensor]] = []
        try:
            for i, op in enumerate(req.loads):
                queued = self.writer.queued(op.identity.digest())
                if queued is not None:  # saved this step or just before: still in memory
                    out.append((op.block_id, queued))
                    self.counters.add(restored_tokens=op.identity.end - op.identity.start)
                    continue
                try:
                    data = self.backend.get(req.caller, op.identity)
                    if data is None:
                        raise BlockMismatch("block is no longer held")
                    payload = open_block(data, op.identity, self.geometry)
                except (BlockMismatch, BackendUnavailable, CallerRefused) as exc:
                    self._fail(req, i)
                    self.counters.add(rejected_blocks=isinstance(exc, BlockMismatch),
                                      backend_errors=isinstance(exc, BackendUnavailable))
                    log.warning("AgentKV: request %s: %d blocks not restored (%s); "
                                "recomputing", req.req_id, len(req.loads) - i, exc)
                    return out
                host = torch.frombuffer(bytearray(payload), dtype=self.layers[0].dtype)
                out.append((op.block_id, host.view(len(self.layers), *self.layers[0].shape[1:])))
                self.counters.add(restored_tokens=op.identity.end - op.identity.start)
            return out
        finally:
            self.counters.add(load_us=int((time.perf_counter() - t0) * 1e6))

    def _fail(self, req: RequestOps, first: int) -> None:
        failed = req.loads[first:]
        with self._pending_lock:
            self._errors.update(o.block_id for o in failed)
            self._failed.setdefault(req.req_id, set()).update(failed)
            self._failed_at = self._steps
        self.counters.add(load_failures=len(failed))

    def _scatter_host(self, block_id: int, host: torch.Tensor) -> None:
        for i, kv in enumerate(self.layers):
            kv[block_id].copy_(host[i], non_blocking=kv.is_cuda)
        if self.layers[0].is_cuda:
            torch.cuda.current_stream().synchronize()

    def take_load_errors(self) -> set[int]:
        with self._pending_lock:
            errors, self._errors = self._errors, set()
        return errors

    def take_failed_loads(self) -> dict[str, FailedLoad]:
        """Per request, the tokens not restored since the last call (each step's), and
        the step of its latest failure."""
        with self._pending_lock:
            failed, self._failed = self._failed, {}
            return {r: FailedLoad(sum(o.identity.end - o.identity.start for o in ops),
                                  self._failed_at) for r, ops in failed.items()}

    def take_skipped(self) -> dict[str, int]:
        """Per request, the first token of the saves skipped since the last call."""
        with self._pending_lock:
            skipped, self._skipped = self._skipped, {}
        return skipped

    # -- saves ------------------------------------------------------------------------
    def wait_for_save(self, meta: AgentKVConnectorMetadata) -> None:
        t0 = time.perf_counter()
        try:
            self._gather(meta)
        except Exception:  # a save is an optimisation: never fail vLLM's step for it
            log.exception("AgentKV: gathering blocks to save failed; skipped")
            self.counters.add(save_failures=1)
        finally:  # copied out (or given up): vLLM may free the finished requests' blocks;
            # a barrier's once every save queued before is written (synchronous: now)
            for req in meta.requests:
                if req.release or req.barrier:
                    self.writer.release(req.req_id, barrier=req.barrier and self.background,
                                        free=req.release)
        us = int((time.perf_counter() - t0) * 1e6)
        self.counters.add(step_wait_us=us, gather_us=us)

    def _gather(self, meta: AgentKVConnectorMetadata) -> None:
        assert self.geometry is not None
        claim = getattr(self.backend, "claim", None)
        with self._pending_lock:  # a failed load the scheduler had not read when it
            unsure = self._failed_at > meta.failures_seen  # planned this step (this one's)
        for req in meta.requests:
            for op in req.saves:
                if unsure:  # computed on blocks never restored, maybe: planned again
                    self.writer.skipped(op.identity)
                    with self._pending_lock:
                        start = self._skipped.get(req.req_id, op.identity.start)
                        self._skipped[req.req_id] = min(start, op.identity.start)
                    continue
                try:
                    if self.backend.contains(req.caller, op.identity):
                        if claim is not None:  # held (another session wrote it): a
                            claim(req.caller, [op.identity])  # reader of it from now on
                        continue
                except (BackendUnavailable, CallerRefused):
                    pass  # the writer will find out and count it
                host = torch.stack([kv[op.block_id] for kv in self.layers]).to("cpu")
                if self.background:
                    self.writer.submit(req.caller, op.identity, host)
                else:
                    self.writer.write(req.caller, op.identity, host)

    def take_passed(self) -> set[str]:
        """Requests whose barrier without a release passed (``RequestOps.barrier``)."""
        return self.writer.take_passed()

    def take_dropped(self) -> set[bytes]:
        """Digests the scheduler must stop matching: dropped by the store, or never saved."""
        dropped = self.writer.take_failed()
        take = getattr(self.backend, "take_dropped", None)
        if take is not None:
            dropped |= take()
        return dropped

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued save is written; False on timeout."""
        return self.writer.flush(timeout_s)

    def close(self) -> None:
        self._jobs.put(_STOP)
        self.writer.close()
        self._loader.join(10.0)
