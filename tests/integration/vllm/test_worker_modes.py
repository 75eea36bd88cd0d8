"""The worker's load modes (layer by layer inside the step, or off the step through
``get_finished``), a finished request's tail kept until it is copied out, hints sent on
their own through the hint socket, and the AgentKV strategy's prefetch before a
predicted tool return: real host pool, real NVMe shard, real tensors, no vLLM engine."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from agentkv_cluster.engines.vllm.backend import ConnectorCounters
from agentkv_cluster.engines.vllm.blocks import (
    EngineVersions,
    block_identity,
    chain_hashes,
    chain_next,
    chain_seed,
)
from agentkv_cluster.engines.vllm.directory import TokenResolver
from agentkv_cluster.engines.vllm.embedded import EmbeddedBackend, EmbeddedSpec
from agentkv_cluster.engines.vllm.hints import HintEvent, HintKind
from agentkv_cluster.engines.vllm.hintsock import HintSocket, send_hint
from agentkv_cluster.engines.vllm.meta import (
    AgentKVConnectorMetadata,
    BlockOp,
    FailedLoad,
    RequestOps,
)
from agentkv_cluster.engines.vllm.worker import WorkerSide
from store.page import HEADER_SIZE

pytestmark = pytest.mark.integration

VERSIONS = EngineVersions(model_version="m@1", tokenizer_version="tok-1", rope_config="r")
BS = 16
LAYERS = 3
PAGE = HEADER_SIZE + LAYERS * 3 * BS * 8 * 4
TOKENS = list(range(500, 500 + 4 * BS))


def _kv(num_blocks=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {f"model.layers.{i}.self_attn.attn": torch.randn(num_blocks, 3, BS, 8, generator=gen)
            for i in range(LAYERS)}


def _ids(namespace="acme", n=3):
    return [block_identity(VERSIONS, namespace=namespace, adapter="", chain=h, index=i,
                           block_size=BS) for i, h in enumerate(chain_hashes(TOKENS, BS)[:n])]


@pytest.fixture
def store():
    backend = EmbeddedBackend(EmbeddedSpec(slot_bytes=PAGE, host_blocks=8, nvme_blocks=8))
    caller = TokenResolver(None, "acme").resolve(None, "s")
    src_kv = _kv()
    src = WorkerSide(backend, ConnectorCounters(), background=True)
    src.register_kv_caches(src_kv)
    ids = _ids()
    src.wait_for_save(AgentKVConnectorMetadata(requests=[RequestOps(
        "save", caller, saves=tuple(BlockOp(ident, b) for b, ident in zip((5, 2, 7), ids)))]))
    assert src.flush(10.0)
    yield backend, caller, ids, src_kv
    src.close()
    backend.close()


BACKGROUND = pytest.mark.parametrize("background", [True, False], ids=["threads", "inline"])


@BACKGROUND
def test_layerwise_load_releases_each_layer_and_is_bit_exact(store, background):
    backend, caller, ids, src_kv = store
    dst_kv = {k: torch.zeros_like(v) for k, v in src_kv.items()}
    counters = ConnectorCounters()
    dst = WorkerSide(backend, counters, background=background)
    dst.register_kv_caches(dst_kv)
    names = list(dst_kv)
    meta = AgentKVConnectorMetadata(requests=[RequestOps(
        "r", caller, loads=tuple(BlockOp(ident, b) for b, ident in zip((1, 3, 4), ids)))])
    dst.begin_step(meta)
    dst.begin_step(meta)  # bind, then start_load_kv: one load, not two
    for name in names:  # what the forward does, layer by layer
        dst.wait_layer(dst.layer_index(name))
        assert torch.equal(dst_kv[name][1], src_kv[name][5])  # this layer has landed
    dst.finish_loads()
    for name in names:
        assert torch.equal(dst_kv[name][3], src_kv[name][2])
        assert torch.equal(dst_kv[name][4], src_kv[name][7])
    assert counters.restored_tokens == 3 * BS and counters.async_loads == 0
    assert dst.get_finished() == (None, None)  # a step load is not reported as async
    dst.close()


@pytest.mark.gpu
def test_a_cuda_layer_has_landed_for_a_forward_on_another_stream(store):
    """A host-to-device copy from pageable memory may return before its DMA ends: a layer
    is released to the forward (vLLM's stream, not the loader thread's) once it is in."""
    backend, caller, ids, src_kv = store
    dst_kv = {k: torch.zeros_like(v, device="cuda") for k, v in src_kv.items()}
    dst = WorkerSide(backend, ConnectorCounters(), background=True)
    dst.register_kv_caches(dst_kv)
    dst.begin_step(AgentKVConnectorMetadata(requests=[RequestOps(
        "r", caller, loads=tuple(BlockOp(ident, b) for b, ident in zip((1, 3, 4), ids)))]))
    forward = torch.cuda.Stream()
    with torch.cuda.stream(forward):
        for name in dst_kv:
            dst.wait_layer(dst.layer_index(name))
            got = dst_kv[name][1].clone()  # read on the forward's stream
            forward.synchronize()
            assert torch.equal(got.cpu(), src_kv[name][5])
    dst.finish_loads()
    dst.close()


@BACKGROUND
def test_async_load_is_reported_by_get_finished_with_its_errors_first(store, background):
    backend, caller, ids, src_kv = store
    dst_kv = {k: torch.zeros_like(v) for k, v in src_kv.items()}
    counters = ConnectorCounters()
    dst = WorkerSide(backend, counters, background=background)
    dst.register_kv_caches(dst_kv)
    gone = block_identity(VERSIONS, namespace="acme", adapter="", chain=b"\x01" * 16, index=3,
                          block_size=BS)
    loads = tuple(BlockOp(ident, b) for b, ident in zip((1, 3, 4, 6), (*ids, gone)))
    dst.begin_step(AgentKVConnectorMetadata(requests=[RequestOps(
        "ra", caller, loads=loads, async_load=True)]))
    dst.finish_loads()  # does not wait for async loads
    deadline = time.monotonic() + 10
    recved: set[str] = set()
    while not recved and time.monotonic() < deadline:
        _, got = dst.get_finished()
        recved |= got or set()
        time.sleep(0.01)
    assert recved == {"ra"}
    assert dst.take_load_errors() == {6}  # recorded before the request was reported
    assert dst.take_failed_loads() == {"ra": FailedLoad(tokens=BS, step=1)}
    name = next(iter(dst_kv))
    assert torch.equal(dst_kv[name][4], src_kv[name][7])
    assert counters.async_loads == 1 and counters.restored_tokens == 3 * BS
    dst.close()


@BACKGROUND
def test_tail_is_saved_and_then_released(store, background):
    backend, caller, ids, src_kv = store
    w = WorkerSide(backend, ConnectorCounters(), background=background)
    w.register_kv_caches(src_kv)
    n = 9  # a finished request's last block holds 9 computed tokens
    parent = chain_hashes(TOKENS, BS)[2]
    tail = block_identity(VERSIONS, namespace="acme", adapter="", index=3, block_size=BS,
                          chain=chain_next(parent, TOKENS[3 * BS:3 * BS + n]), tokens=n)
    assert (tail.start, tail.end) == (3 * BS, 3 * BS + n) and tail.digest() != ids[2].digest()
    w.wait_for_save(AgentKVConnectorMetadata(requests=[RequestOps(
        "fin", caller, saves=(BlockOp(tail, 6),), release=True)]))
    assert w.get_finished() == ({"fin"}, None)  # vLLM may free the request's blocks now
    assert w.flush(10.0)
    assert backend.lookup(caller, [tail]) == 1
    assert chain_next(chain_seed(), TOKENS[:BS]) == chain_hashes(TOKENS, BS)[0]
    w.close()


def test_hint_socket_delivers_hints_and_flags_garbage(tmp_path: Path):
    path = str(tmp_path / "h.sock")
    sock = HintSocket(path)
    try:
        assert sock.drain() == []
        send_hint(path, {"session": "s1", "events": [{"kind": "tool_start", "tool": "grep"}]})
        import socket
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"\xff not json", path)
        got = sock.drain()
        assert got[0] == {"agentkv": {"session": "s1",
                                      "events": [{"kind": "tool_start", "tool": "grep"}]}}
        assert got[1] is None
        assert (Path(path).stat().st_mode & 0o077) == 0  # owner only
    finally:
        sock.close()
    assert not Path(path).exists()
    with pytest.raises(OSError):
        send_hint(path, {"session": "s1", "events": [{"kind": "task_end"}]})


@pytest.mark.parametrize("strategy", ["agentkv", "lru"])
def test_prefetch_brings_a_paused_session_back_before_its_predicted_return(strategy):
    from agentkv_cluster.engines.vllm.blocks import BlockGeometry, seal_block

    backend = EmbeddedBackend(EmbeddedSpec(slot_bytes=PAGE, host_blocks=2, nvme_blocks=6,
                                           strategy=strategy, prefetch_lead_s=0.0))
    try:
        paused = TokenResolver(None, "acme").resolve(None, "paused")
        busy = TokenResolver(None, "acme").resolve(None, "busy")
        geom = BlockGeometry(layers=LAYERS, per_layer=(3, BS, 8), dtype="float32")
        page = bytes(PAGE - HEADER_SIZE)
        mine = _ids(n=2)
        for ident in mine:
            backend.put(paused, ident, seal_block(ident, geom, page))
        # 2 s: the puts and gets below (NVMe I/O) stay well inside it on a loaded box
        backend.event(paused, HintEvent(kind=HintKind.TOOL_START, tool="build", expected_s=2.0))
        sent = time.monotonic()
        other = [block_identity(VERSIONS, namespace="acme", adapter="", chain=h, index=i,
                                block_size=BS)
                 for i, h in enumerate(chain_hashes(list(range(9000, 9000 + 4 * BS)), BS))]
        for ident in other:  # the busy session takes the host pool meanwhile
            backend.put(busy, ident, seal_block(ident, geom, page))
            backend.get(busy, ident)

        def on_nvme():
            return sum(backend._blocks[i.digest()].tier.name == "NVME" for i in mine)
        away = on_nvme()
        assert away >= 1 and backend.stats()["host_blocks"] == 2
        assert backend.prefetch_due() == 0  # not yet: predicted back in 2 s
        time.sleep(max(0.0, sent + 2.05 - time.monotonic()))
        if strategy == "agentkv":
            assert backend.prefetch_due() == away and on_nvme() == 0
        else:  # the LRU strategy has no lifecycle signals: nothing moves before the read
            assert backend.prefetch_due() == 0 and on_nvme() == away
        assert backend.prefetch_due() == 0  # once per tool call
        assert backend.get(paused, mine[0]) is not None and backend.get(paused, mine[1])
    finally:
        backend.close()


def test_worker_threads_stop_on_close():
    backend = EmbeddedBackend(EmbeddedSpec(slot_bytes=PAGE, host_blocks=2, nvme_blocks=0))
    before = {t.name for t in threading.enumerate()}
    w = WorkerSide(backend, ConnectorCounters())
    w.close()
    backend.close()
    assert {t.name for t in threading.enumerate() if t.is_alive()} <= before
