"""Page cutting, prefix hashing and cache assembly (no model needed)."""

from __future__ import annotations

import pytest
import torch

from agentkv_cluster.engines.hf import (
    AdapterConfig,
    DynamicCache,
    UnsupportedCache,
    cache_to_kv,
    chain_hashes,
    drop_cache,
    page_ranges,
    pages_to_cache,
)


def test_page_ranges_cover_tokens_with_a_partial_tail():
    assert page_ranges(130, 64) == [(0, 64), (64, 128), (128, 130)]
    assert page_ranges(128, 64) == [(0, 64), (64, 128)]
    assert page_ranges(0, 64) == []


def test_chain_hash_of_a_page_depends_on_every_earlier_token():
    base = list(range(200))
    changed = base.copy()
    changed[10] = 999  # inside page 0
    a, b = chain_hashes(base, 64), chain_hashes(changed, 64)
    assert len(a) == 4 and all(x != y for x, y in zip(a, b))
    tail_only = base[:199] + [7]
    c = chain_hashes(tail_only, 64)
    assert c[:3] == a[:3] and c[3] != a[3]
    assert chain_hashes(base[:128], 64) == a[:2]


def test_pages_to_cache_round_trips_through_cache_to_kv():
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(3, 2, 10, 8, generator=gen)
    v = torch.randn(3, 2, 10, 8, generator=gen)
    cache = pages_to_cache([k[:, :, :4], k[:, :, 4:]], [v[:, :, :4], v[:, :, 4:]])
    assert cache.get_seq_length() == 10 and len(cache.layers) == 3
    k2, v2 = cache_to_kv(cache)
    assert torch.equal(k, k2) and torch.equal(v, v2)
    # New tokens append after the restored ones, as after a normal prefill.
    cache.update(torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8), layer_idx=0)
    assert cache.layers[0].keys.shape == (1, 2, 11, 8)
    drop_cache(cache)
    assert all(layer.keys is None for layer in cache.layers)


def test_cache_to_kv_rejects_batches_and_empty_caches():
    with pytest.raises(UnsupportedCache):
        cache_to_kv(DynamicCache())
    batch2 = DynamicCache(ddp_cache_data=[(torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4))])
    with pytest.raises(UnsupportedCache):
        cache_to_kv(batch2)


def test_adapter_config_rejects_empty_pages():
    with pytest.raises(ValueError):
        AdapterConfig(page_tokens=0)
