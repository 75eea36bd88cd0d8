"""How the worker side addresses vLLM's KV cache.

- A restored tail (a partly filled block) shares its block with the tokens the forward
  computes in the same step, and vLLM writes those before it waits for the layer
  (``unified_kv_cache_update`` runs before ``wait_for_layer_load``): copied layer by
  layer beside the forward, the whole saved block overwrote them. It is now copied
  before the forward.
- An attention backend whose kernel block is smaller than vLLM's block registers one row
  per kernel block; indexed with vLLM's block ids, the connector read and wrote other
  blocks. The rows are grouped per vLLM block (or the layout refused)."""

from __future__ import annotations

import threading

import pytest
import torch

from agentkv_cluster.engines.vllm.backend import Caller, ConnectorCounters
from agentkv_cluster.engines.vllm.blocks import (
    BlockGeometry,
    EngineVersions,
    block_identity,
    seal_block,
)
from agentkv_cluster.engines.vllm.layout import block_views
from agentkv_cluster.engines.vllm.meta import AgentKVConnectorMetadata, BlockOp, RequestOps
from agentkv_cluster.engines.vllm.worker import WorkerSide

VERSIONS = EngineVersions(model_version="m", tokenizer_version="t", rope_config="r")
BS, LAYERS = 16, 2
CALLER = Caller(tenant="acme", session="s")


class PageStore:
    """Block pages by digest; a read of a digest in ``gated`` waits for ``gate``."""

    name = "pages"

    def __init__(self) -> None:
        self.pages: dict[bytes, bytes] = {}
        self.gated: set[bytes] = set()
        self.gate = threading.Event()

    def get(self, caller, identity) -> bytes | None:
        if identity.digest() in self.gated:
            self.gate.wait(10.0)
        return self.pages.get(identity.digest())

    def contains(self, caller, identity) -> bool:
        return identity.digest() in self.pages

    def put(self, caller, identity, data) -> None:
        self.pages[identity.digest()] = bytes(data)

    def close(self) -> None:
        return None


def _ident(index: int, tokens: int | None = None):
    return block_identity(VERSIONS, namespace="acme", adapter="", chain=bytes([index]) * 16,
                          index=index, block_size=BS, tokens=tokens)


def test_a_restored_tail_leaves_the_tokens_the_forward_writes_beside_it():
    src = [torch.randn(8, 2, BS, 8) for _ in range(LAYERS)]  # [blocks, heads, tokens, ch]
    geometry = BlockGeometry(layers=LAYERS, per_layer=(2, BS, 8), dtype="float32")
    full, tail = _ident(0), _ident(1, tokens=10)
    store = PageStore()
    for ident, block in ((full, 0), (tail, 1)):
        payload = torch.stack([kv[block] for kv in src]).numpy().tobytes()
        store.put(CALLER, ident, seal_block(ident, geometry, payload))
    store.gated.add(full.digest())  # the full block's read is slow
    dst = {f"model.layers.{i}.attn": torch.zeros(8, 2, BS, 8) for i in range(LAYERS)}
    worker = WorkerSide(store, ConnectorCounters(), background=True)
    worker.register_kv_caches(dst)
    meta = AgentKVConnectorMetadata(requests=[RequestOps(
        "r", CALLER, loads=(BlockOp(full, 4), BlockOp(tail, 5)), tail=True)])
    worker.begin_step(meta)  # bound before the forward
    for kv in dst.values():  # the forward: this step's tokens 10.. into the tail's block,
        kv[5][:, 10:] = 7.0  # each layer's before it waits for that layer
    store.gate.set()
    for i in range(LAYERS):
        worker.wait_layer(i)
    worker.finish_loads()
    for kv, s in zip(dst.values(), src, strict=True):
        assert torch.equal(kv[4], s[0])
        assert torch.equal(kv[5][:, :10], s[1][:, :10])
        assert bool((kv[5][:, 10:] == 7.0).all())  # the forward's, not the saved block's
    assert worker.take_load_errors() == set()
    worker.close()


def test_kernel_blocks_are_grouped_per_vllm_block():
    blocks, split = 4, 2  # the backend's kernel block: half of vLLM's
    raw_src = {f"model.layers.{i}.attn": torch.randn(blocks * split, 2, BS // split, 8)
               for i in range(LAYERS)}
    raw_dst = {n: torch.zeros_like(t) for n, t in raw_src.items()}
    store = PageStore()
    src = WorkerSide(store, ConnectorCounters(), background=False)
    src.register_kv_caches(block_views(raw_src, blocks))
    ident = _ident(0)
    save = AgentKVConnectorMetadata(requests=[RequestOps("w", CALLER, saves=(BlockOp(ident, 1),))])
    src.begin_step(save)
    src.wait_for_save(save)
    dst = WorkerSide(store, ConnectorCounters(), background=False)
    dst.register_kv_caches(block_views(raw_dst, blocks))
    dst.begin_step(AgentKVConnectorMetadata(requests=[
        RequestOps("r", CALLER, loads=(BlockOp(ident, 3),))]))
    assert dst.take_load_errors() == set()
    for name, t in raw_dst.items():
        assert torch.equal(t[6:8], raw_src[name][2:4])  # vLLM block 1 -> 3: both halves
        assert not t[:6].any()
    src.close()
    dst.close()


def test_a_row_count_that_is_no_multiple_of_the_blocks_is_refused():
    with pytest.raises(ValueError, match="9 rows at dim 0 for 4 vLLM blocks"):
        block_views({"model.layers.0.attn": torch.zeros(9, 2, BS, 8)}, 4)
