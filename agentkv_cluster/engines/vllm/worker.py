"""Worker side of the connector: moves KV bytes between vLLM's paged cache and the backend.

vLLM's per-layer KV tensors put blocks at dim 0 (``[num_blocks, ...]``, the standardised
layout of vLLM >= 0.32), so a block of one layer is ``kv[block_id]`` whatever the
attention backend stores inside it; a block page is those slices of every layer, in
layer order, at full precision.

- Loads run in ``start_load_kv``, before the forward that reads them. A block that is
  missing, damaged or of another identity stops the request's load there: it and every
  later block are reported through ``get_block_ids_with_load_errors`` and vLLM
  recomputes them (the connector sets ``kv_load_failure_policy="recompute"``).
- Saves are gathered in ``wait_for_save`` (after the forward wrote the step's KV) into
  host memory, then written by a background thread, so vLLM frees or reuses the blocks
  at once and never waits for the store; a full queue skips the save (a counted miss).

On a CUDA device the gather is a device-to-host copy and the scatter a host-to-device one;
nothing else differs.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from typing import Any

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
    seal_block,
)
from agentkv_cluster.engines.vllm.meta import AgentKVConnectorMetadata, RequestOps

log = logging.getLogger(__name__)
_LAYER_RE = re.compile(r"layers\.(\d+)\.")
_STOP = object()


def _layer_order(name: str) -> tuple[int, str]:
    m = _LAYER_RE.search(name)
    return (int(m.group(1)) if m else 1 << 30, name)


class WorkerSide:
    def __init__(self, backend: BlockBackend, counters: ConnectorCounters,
                 save_queue: int = 256) -> None:
        self.backend = backend
        self.counters = counters
        self.layers: list[torch.Tensor] = []
        self.geometry: BlockGeometry | None = None
        self._errors: set[int] = set()
        self._pending: dict[bytes, torch.Tensor] = {}  # queued saves, servable before written
        self._pending_lock = threading.Lock()
        self._failed_saves: set[bytes] = set()
        self._failed_loads: dict[str, int] = {}  # req id -> tokens not restored
        self._queue: queue.Queue = queue.Queue(maxsize=save_queue)
        self._writer = threading.Thread(target=self._write_loop, name="agentkv-save",
                                        daemon=True)
        self._writer.start()

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        names = sorted(kv_caches, key=_layer_order)
        self.layers = [kv_caches[n] for n in names]
        first = self.layers[0]
        for t in self.layers:
            if t.shape[1:] != first.shape[1:] or t.dtype != first.dtype:
                raise ValueError("AgentKV needs every layer's KV block in one shape and dtype")
        self.geometry = BlockGeometry(layers=len(self.layers), per_layer=tuple(first.shape[1:]),
                                      dtype=str(first.dtype).removeprefix("torch."))
        log.info("AgentKV: %d KV layers, block %s %s, %d blocks on %s", len(self.layers),
                 self.geometry.per_layer, self.geometry.dtype, first.shape[0], first.device)

    # -- loads ------------------------------------------------------------------------
    def start_load_kv(self, meta: AgentKVConnectorMetadata) -> None:
        for caller, event in meta.events:
            try:
                self.backend.event(caller, event)
            except (BackendUnavailable, CallerRefused, ValueError) as exc:
                log.warning("AgentKV: event %s not applied: %s", event.kind.value, exc)
        for req in meta.requests:
            if req.loads:
                try:
                    self._load(req)
                except Exception:  # never into vLLM's step: those blocks are recomputed
                    log.exception("AgentKV: loading for %s failed; recomputing", req.req_id)
                    self._errors.update(op.block_id for op in req.loads)
                    self._failed_loads[req.req_id] = sum(
                        o.identity.end - o.identity.start for o in req.loads)
                    self.counters.add(load_failures=len(req.loads))

    def _load(self, req: RequestOps) -> None:
        assert self.geometry is not None
        for i, op in enumerate(req.loads):
            with self._pending_lock:
                queued = self._pending.get(op.identity.digest())
            if queued is not None:  # saved this step or just before: still in host memory
                self._scatter_host(op.block_id, queued)
                self.counters.add(restored_tokens=op.identity.end - op.identity.start)
                continue
            try:
                data = self.backend.get(req.caller, op.identity)
                if data is None:
                    raise BlockMismatch("block is no longer held")
                payload = open_block(data, op.identity, self.geometry)
            except (BlockMismatch, BackendUnavailable, CallerRefused) as exc:
                failed = [o.block_id for o in req.loads[i:]]
                self._errors.update(failed)
                self._failed_loads[req.req_id] = sum(
                    o.identity.end - o.identity.start for o in req.loads[i:])
                self.counters.add(load_failures=len(failed),
                                  rejected_blocks=isinstance(exc, BlockMismatch),
                                  backend_errors=isinstance(exc, BackendUnavailable))
                log.warning("AgentKV: request %s: %d blocks not restored (%s); recomputing",
                            req.req_id, len(failed), exc)
                return
            self._scatter(op.block_id, payload)
            self.counters.add(restored_tokens=op.identity.end - op.identity.start)

    def _scatter(self, block_id: int, payload: memoryview) -> None:
        host = torch.frombuffer(bytearray(payload), dtype=self.layers[0].dtype)
        self._scatter_host(block_id, host.view(len(self.layers), *self.layers[0].shape[1:]))

    def _scatter_host(self, block_id: int, host: torch.Tensor) -> None:
        for i, kv in enumerate(self.layers):
            kv[block_id].copy_(host[i], non_blocking=kv.is_cuda)
        if self.layers[0].is_cuda:
            torch.cuda.current_stream().synchronize()

    def take_load_errors(self) -> set[int]:
        errors, self._errors = self._errors, set()
        return errors

    def take_failed_loads(self) -> dict[str, int]:
        failed, self._failed_loads = self._failed_loads, {}
        return failed

    # -- saves ------------------------------------------------------------------------
    def wait_for_save(self, meta: AgentKVConnectorMetadata) -> None:
        try:
            self._gather(meta)
        except Exception:  # a save is an optimisation: never fail vLLM's step for it
            log.exception("AgentKV: gathering blocks to save failed; skipped")
            self.counters.add(save_failures=1)

    def _gather(self, meta: AgentKVConnectorMetadata) -> None:
        assert self.geometry is not None
        for req in meta.requests:
            for op in req.saves:
                try:
                    if self.backend.contains(req.caller, op.identity):
                        continue
                except (BackendUnavailable, CallerRefused):
                    pass  # the writer will find out and count it
                host = torch.stack([kv[op.block_id] for kv in self.layers]).to("cpu")
                digest = op.identity.digest()
                with self._pending_lock:
                    self._pending[digest] = host
                try:
                    self._queue.put_nowait((req.caller, op.identity, host))
                except queue.Full:
                    self.counters.add(save_dropped=1)
                    with self._pending_lock:
                        self._pending.pop(digest, None)
                        self._failed_saves.add(digest)

    def take_dropped(self) -> set[bytes]:
        """Digests the scheduler must stop matching: dropped by the store, or never saved."""
        with self._pending_lock:
            dropped, self._failed_saves = self._failed_saves, set()
        take = getattr(self.backend, "take_dropped", None)
        if take is not None:
            dropped |= take()
        return dropped

    def _write_loop(self) -> None:
        warned = False
        while True:
            item = self._queue.get()
            if item is _STOP:
                self._queue.task_done()
                return
            caller, identity, host = item
            try:
                self._put(caller, identity, host)
                warned = False
            except Exception as exc:  # noqa: BLE001 - the writer thread must survive anything
                self.counters.add(save_failures=1)
                with self._pending_lock:
                    self._failed_saves.add(identity.digest())
                if not warned:  # once per outage, not once per block
                    log.warning("AgentKV: saving blocks failed: %s", exc)
                    warned = True
            finally:
                with self._pending_lock:
                    self._pending.pop(identity.digest(), None)
                self._queue.task_done()

    def _put(self, caller: Any, identity: Any, host: torch.Tensor) -> None:
        assert self.geometry is not None
        page = seal_block(identity, self.geometry,
                          host.contiguous().view(torch.uint8).numpy().tobytes())
        self.backend.put(caller, identity, page)
        self.counters.add(saved_blocks=1)

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
        self._writer.join(10.0)
