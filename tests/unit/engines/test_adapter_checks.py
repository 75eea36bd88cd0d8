"""What the transformers adapter refuses: changed page bytes, KV of another geometry or
dtype, contexts past the model's positions, empty prefills (tiny geometry, no weights)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agentkv_cluster.engines.hf import (
    AdapterConfig,
    ContextTooLong,
    CorruptPage,
    DynamicCache,
    EmptyInput,
    HfKVAdapter,
    UnsupportedCache,
    prefill,
)
from agentkv_cluster.engines.model import LoadedModel
from store.codecs import CodecSpec
from tests.unit.engines.standins import DictPageStore

LAYERS, HEADS, TOKENS, DIM = 2, 2, 40, 8
MAX_POSITIONS = 64


def _loaded() -> LoadedModel:
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=MAX_POSITIONS))
    return LoadedModel(model=model, tokenizer=None, model_version="m@1", tokenizer_version="t",
                       rope_config='{"rope": "default"}', num_layers=LAYERS, kv_heads=HEADS,
                       head_dim=DIM, dtype=torch.float32)


def _cache(tokens: int = TOKENS, layers: int = LAYERS, dtype=torch.float32) -> DynamicCache:
    gen = torch.Generator().manual_seed(5)
    return DynamicCache(ddp_cache_data=[
        (torch.randn(1, HEADS, tokens, DIM, generator=gen).to(dtype),
         torch.randn(1, HEADS, tokens, DIM, generator=gen).to(dtype))
        for _ in range(layers)])


@pytest.fixture
def store() -> DictPageStore:
    return DictPageStore()


@pytest.fixture
def adapter(store: DictPageStore) -> HfKVAdapter:
    return HfKVAdapter(_loaded(), store, AdapterConfig(page_tokens=16, tenant="t1"))


@pytest.mark.parametrize("spec", [CodecSpec.full(), CodecSpec.int8()])
def test_a_page_whose_stored_bytes_changed_is_refused_not_restored(adapter, store, spec):
    tokens = list(range(100, 100 + TOKENS))
    receipt = adapter.store("s", tokens, _cache(), event_version=1, specs=(spec,))
    blob = store.blobs[receipt.pages[1].key]
    blob[-64] ^= 0x40  # one bit of the tensor payload (bit rot, a stray write)
    with pytest.raises(CorruptPage, match="checksum"):
        adapter.restore("s", tokens, spec=spec, recompute=False)
    # The page before it is intact and still restores on its own.
    assert adapter.restore("s", tokens[:16], spec=spec, recompute=False).restored_tokens == 16


@pytest.mark.parametrize(("cache", "what"), [
    (_cache(dtype=torch.float16), "float16"),
    (_cache(layers=LAYERS - 1), f"({LAYERS - 1}, "),
])
def test_store_refuses_kv_of_another_dtype_or_geometry(adapter, store, cache, what):
    with pytest.raises(UnsupportedCache, match=r"model's is \(2, 2, 40, 8\)") as err:
        adapter.store("s", list(range(TOKENS)), cache, event_version=1)
    assert what in str(err.value)
    assert not store.blobs and adapter.pages("s") == []


def test_contexts_past_the_models_positions_are_refused(adapter):
    with pytest.raises(ContextTooLong, match="65 tokens, the model has 64 positions"):
        adapter.restore("s", list(range(MAX_POSITIONS + 1)))
    full = _cache(tokens=MAX_POSITIONS - 1)
    with pytest.raises(ContextTooLong):  # refused before the model runs
        prefill(adapter._loaded.model, [1, 2], full)


def test_an_empty_prefill_is_refused_with_a_typed_error():
    with pytest.raises(EmptyInput):
        prefill(_loaded().model, [], DynamicCache())
