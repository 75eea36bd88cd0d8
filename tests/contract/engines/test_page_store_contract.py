"""One contract for every `PageStore` the engine adapter can use: the shared-memory
host pool and the AgentKV service (built in-process, no Ray), each real."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import uuid
from pathlib import Path

import pytest
import torch

from agentkv_cluster.config import load_config
from agentkv_cluster.engines.hf import AdapterConfig, DynamicCache, HfKVAdapter, cache_to_kv
from agentkv_cluster.engines.model import LoadedModel
from agentkv_cluster.engines.page_store import (
    HostPoolPageStore,
    OneFormPerPage,
    ServicePageStore,
)
from agentkv_cluster.lifecycle.identity import PageIdentity
from agentkv_cluster.runtime.service import Service
from store.codecs import CodecSpec
from store.types import Lookup

pytestmark = pytest.mark.integration

TENANT = "acme"
# A tiny model geometry: the adapter needs versions and shapes, not weights, to store
# and restore without recomputation.
GEOMETRY = {"num_layers": 2, "kv_heads": 2, "head_dim": 8, "dtype": torch.float32}


@pytest.fixture(scope="module")
def service():
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-engine-contract-"))
    cfg = load_config(env={}, overrides={
        "api": {"port": 0},
        "hbm": {"page_bytes": 1 << 16, "num_pages": 32},
        "pool": {"pool_bytes": 4 << 20, "slot_bytes": 1 << 16, "nvme_dir": str(workdir / "nv")},
    })
    svc = Service(cfg, workdir=workdir).start(local=True)
    yield svc
    svc.stop()


@pytest.fixture(params=["host_pool", "service"])
def store(request):
    if request.param == "host_pool":
        s = HostPoolPageStore.create(f"agentkv-test-psc-{os.getpid()}-{uuid.uuid4().hex[:8]}",
                                     1 << 16, 32)
        yield s
        s.close()
        return
    client = request.getfixturevalue("service").client(TENANT)
    yield ServicePageStore(client.open_session(f"s-{uuid.uuid4().hex[:8]}"))
    client.close()


def _identity(start: int, end: int) -> PageIdentity:
    return PageIdentity(model_version="m", adapter_version="", tokenizer_version="t",
                        rope_config="r", tenant=TENANT, session="s", start=start, end=end,
                        event_version=1)


def test_put_get_delete(store):
    data = bytes(range(256)) * 16
    store.put(b"k1", data, _identity(0, 16))
    assert b"k1" in store
    found, got = store.get(b"k1")
    assert found is Lookup.HIT and bytes(got) == data
    store.delete(b"k1")
    assert b"k1" not in store
    assert store.get(b"k1") == (Lookup.MISS, None)
    store.delete(b"k1")  # deleting twice is not an error


def test_unknown_key_is_a_miss(store):
    assert store.get(b"never-stored") == (Lookup.MISS, None)


def test_adapter_round_trip_restores_identical_kv(store):
    loaded = LoadedModel(model=None, tokenizer=None, model_version="m@1", tokenizer_version="t",
                         rope_config='{"rope": "default"}', **GEOMETRY)
    adapter = HfKVAdapter(loaded, store, AdapterConfig(page_tokens=16, tenant=TENANT))
    gen = torch.Generator().manual_seed(3)
    cache = DynamicCache(ddp_cache_data=[
        (torch.randn(1, 2, 40, 8, generator=gen), torch.randn(1, 2, 40, 8, generator=gen))
        for _ in range(2)])
    tokens = list(range(100, 140))
    receipt = adapter.store("s", tokens, cache, event_version=1,
                            specs=(CodecSpec.full(),))
    assert receipt.written == 3  # 16 + 16 + a partial page of 8
    restored = adapter.restore("s", tokens, recompute=False)
    assert (restored.restored_tokens, restored.pages_hit) == (40, 3)
    k, v = cache_to_kv(restored.cache)
    k0, v0 = cache_to_kv(cache)
    assert torch.equal(k, k0) and torch.equal(v, v0)
    assert adapter.release("s") == 3
    assert adapter.restore("s", tokens, recompute=False).restored_tokens == 0


def test_the_service_refuses_a_second_form_of_a_page_with_a_typed_error(service):
    client = service.client(TENANT)
    try:
        session = f"s-{uuid.uuid4().hex[:8]}"
        store = ServicePageStore(client.open_session(session))
        page = dataclasses.replace(_identity(0, 16), session=session)
        store.put(b"full", b"f" * 4096, page)
        with pytest.raises(OneFormPerPage, match=r"\[0, 16\).*one form per page"):
            store.put(b"int8", b"q" * 1024, page)
        assert b"int8" not in store and bytes(store.get(b"full")[1]) == b"f" * 4096
    finally:
        client.close()
