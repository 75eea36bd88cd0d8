"""`AgentKVConnector`: AgentKV as a vLLM v1 KV connector (``KVConnectorBase_V1``, vLLM 0.32).

Load it with::

    KVTransferConfig(kv_connector="AgentKVConnector", kv_role="kv_both",
                     kv_connector_module_path="agentkv_cluster.engines.vllm.connector",
                     kv_connector_extra_config={"backend": "embedded", "strategy": "agentkv"})

The class is a thin shell: the scheduler role delegates to `SchedulerSide`, the worker
role to `WorkerSide`; the backend is the embedded store (`embedded.py`) or the AgentKV
service (`service.py`). A failed load is recomputed (the connector sets vLLM's
``kv_load_failure_policy`` to ``"recompute"``); a failed save is a later miss.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from agentkv_cluster.engines.vllm.backend import ConnectorCounters
from agentkv_cluster.engines.vllm.config import ConnectorConfig, engine_versions
from agentkv_cluster.engines.vllm.directory import (
    EmbeddedDirectory,
    TenantErasures,
    TokenResolver,
)
from agentkv_cluster.engines.vllm.embedded import EmbeddedBackend, EmbeddedSpec
from agentkv_cluster.engines.vllm.hintsock import HintSocket
from agentkv_cluster.engines.vllm.layout import block_views
from agentkv_cluster.engines.vllm.meta import (
    AgentKVConnectorMetadata,
    AgentKVWorkerMeta,
    BarrierReports,
)
from agentkv_cluster.engines.vllm.scheduler import SchedulerSide
from agentkv_cluster.engines.vllm.service import ServiceBackend
from agentkv_cluster.engines.vllm.worker import WorkerSide
from store.page import HEADER_SIZE

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)


class AgentKVConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.config = ConnectorConfig.from_extra(self._kv_transfer_config.kv_connector_extra_config)
        self.counters = ConnectorCounters()
        self._stats_file = os.environ.get("AGENTKV_VLLM_STATS")
        self._last_stats: dict[str, int] | None = None
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        self._barriers = BarrierReports(vllm_config.parallel_config.world_size)
        cfg = self.config
        if role == KVConnectorRole.SCHEDULER:
            if self._kv_transfer_config.kv_load_failure_policy != "recompute":
                log.info("AgentKV: kv_load_failure_policy set to 'recompute' (a block that "
                         "cannot be restored is recomputed, never a failed request)")
                self._kv_transfer_config.kv_load_failure_policy = "recompute"
            backend: Any
            if cfg.backend == "service":
                backend = self._service()
            else:
                backend = EmbeddedDirectory(TokenResolver(
                    cfg.token_secret(), cfg.default_tenant,
                    TenantErasures(cfg.keys_dir) if cfg.keys_dir else None))
            self._scheduler = SchedulerSide(
                backend, engine_versions(vllm_config), vllm_config.cache_config.block_size,
                self.counters, remote=cfg.backend == "service",
                lookup_timeout_s=cfg.lookup_timeout_s, async_load=cfg.async_load,
                min_tail_tokens=cfg.min_tail_tokens,
                hints=HintSocket(cfg.hint_socket) if cfg.hint_socket else None)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """Layer-by-layer loads make the forward wait in ``wait_for_layer_load``, which a
        full CUDA graph skips on replay (the forward would read layers not copied yet):
        vLLM then captures piecewise graphs. Asynchronous loads, and copies run between
        forwards (``background_io: off``), leave the forward nothing to wait for."""
        cfg = ConnectorConfig.from_extra(extra_config)
        return not cfg.async_load and cfg.background_io != "off"

    def _service(self) -> ServiceBackend:
        cfg = self.config
        return ServiceBackend(cfg.address(), default_token=cfg.service_token,
                              timeout_s=cfg.service_timeout_s, retry_after_s=cfg.retry_after_s,
                              max_sessions=cfg.service_max_sessions)

    # ------------------------------------------------------------------ worker role
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        cfg = self.config
        kv_caches = block_views(kv_caches, self._kv_cache_config.num_blocks)
        if cfg.backend == "service":
            backend: Any = self._service()
        else:
            first = next(iter(kv_caches.values()))
            block_bytes = first[0].numel() * first.element_size() * len(kv_caches)
            backend = EmbeddedBackend(EmbeddedSpec(
                slot_bytes=HEADER_SIZE + block_bytes, host_blocks=cfg.host_blocks,
                nvme_blocks=cfg.nvme_blocks, nvme_dir=cfg.nvme_dir, strategy=cfg.strategy,
                prefetch_lead_s=cfg.prefetch_lead_s, keys_dir=cfg.keys_dir))
        background = {"auto": True if cfg.backend == "service" else None,  # network waits
                      "on": True, "off": False}[cfg.background_io]
        self._worker = WorkerSide(backend, self.counters, cfg.save_queue, background)
        self._worker.register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and isinstance(connector_metadata, AgentKVConnectorMetadata):
            self._worker.begin_step(connector_metadata)  # loads start before the forward

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if self._worker is not None and isinstance(meta, AgentKVConnectorMetadata):
            self._worker.begin_step(meta)  # a no-op when bind already began this step

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._worker is not None:
            index = self._worker.layer_index(layer_name)
            if index is not None:
                self._worker.wait_layer(index)

    def get_finished(self, finished_req_ids: set[str]
                     ) -> tuple[set[str] | None, set[str] | None]:
        if self._worker is None:
            return None, None
        return self._worker.get_finished()

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: AttentionMetadata, **kwargs: Any) -> None:
        return  # blocks are gathered once per step in wait_for_save, all layers at once

    def wait_for_save(self) -> None:
        if self._worker is None:
            return
        self._worker.finish_loads()
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if isinstance(meta, AgentKVConnectorMetadata):
            self._worker.wait_for_save(meta)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_load_errors() if self._worker is not None else set()

    def build_connector_worker_meta(self) -> AgentKVWorkerMeta | None:
        if self._worker is None:
            return None
        self._write_stats()
        dropped, failed = self._worker.take_dropped(), self._worker.take_failed_loads()
        passed = dict.fromkeys(self._worker.take_passed(), 1)  # this worker's report
        skipped = self._worker.take_skipped()
        if dropped or failed or passed or skipped:
            return AgentKVWorkerMeta(dropped, failed, passed, skipped)
        return None

    def _write_stats(self) -> None:
        """``AGENTKV_VLLM_STATS=PATH``: the worker's counters as JSON (tests, benchmark)."""
        if not self._stats_file:
            return
        snap = self.counters.snapshot()
        if snap == self._last_stats:
            return
        self._last_stats = snap
        tmp = f"{self._stats_file}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump(snap, fh)
        os.replace(tmp, self._stats_file)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.flush(5.0)
            self._write_stats()
            self._worker.close()
            self._worker.backend.close()
        if self._scheduler is not None:
            self._scheduler.close()
            self._scheduler.backend.close()

    # --------------------------------------------------------------- scheduler role
    def on_new_request(self, request: Request) -> None:
        if self._scheduler is not None:
            self._scheduler.arrived(request)  # in flight: a task_end's close waits for it

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int
                                   ) -> tuple[int | None, bool]:
        assert self._scheduler is not None
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        assert self._scheduler is not None
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self._scheduler is not None
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        if self._scheduler is None:
            return
        meta = connector_output.kv_connector_worker_meta
        released = set(connector_output.finished_sending or ())
        if isinstance(meta, AgentKVWorkerMeta):
            self._scheduler.forget(meta.dropped)
            self._scheduler.load_failed(meta.failed_loads)
            self._scheduler.saves_skipped(meta.skipped, connector_output.invalid_block_ids,
                                          set(meta.failed_loads))
            released |= self._barriers.passed(meta.passed)
        self._scheduler.loaded(connector_output.finished_recving)
        self._scheduler.released(released)  # the closes they held back go out

    def has_pending_push_work(self) -> bool:
        """A session's close waits for a barrier the worker reports (``retiring.py``):
        the engine keeps stepping, though it may have no request left, until it does."""
        return self._scheduler is not None and self._scheduler.awaiting_barriers

    def request_finished(self, request: Request, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        return self._scheduler.request_finished(request, block_ids)
