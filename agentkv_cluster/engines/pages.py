"""Pages of a `DynamicCache`: cutting token ranges, chaining their hashes, stacking the
cache into [layers, kv_heads, tokens, head_dim] tensors and assembling it back."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agentkv_cluster.engines.errors import UnsupportedCache

_ROOT_HASH = hashlib.blake2b(b"agentkv-engine-root", digest_size=16).digest()


def cache_to_kv(cache: DynamicCache) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack a batch-1 cache into K, V tensors shaped [layers, kv_heads, tokens, head_dim]."""
    layers = getattr(cache, "layers", None)
    if not layers or any(layer.keys is None for layer in layers):
        raise UnsupportedCache("cache is empty or not a layered DynamicCache")
    if layers[0].keys.shape[0] != 1:
        raise UnsupportedCache(f"batch size must be 1, got {layers[0].keys.shape[0]}")
    if any(getattr(layer, "is_sliding", False) for layer in layers):
        raise UnsupportedCache("sliding-window layers keep only a window; pages need all tokens")
    k = torch.stack([layer.keys[0] for layer in layers])
    v = torch.stack([layer.values[0] for layer in layers])
    return k, v


def pages_to_cache(ks: Sequence[torch.Tensor], vs: Sequence[torch.Tensor],
                   device: torch.device | str | None = None) -> DynamicCache:
    """A `DynamicCache` from consecutive pages, each [layers, kv_heads, tokens, head_dim],
    on ``device`` (default: where the pages are).

    The pages are joined once and moved once (one copy of K and one of V to the device),
    and each layer gets its slice as is: `DynamicLayer.update` would copy it a second
    time (restore is on the TTFT path).
    """
    k_all = torch.cat(list(ks), dim=2)
    v_all = torch.cat(list(vs), dim=2)
    if device is not None:
        k_all, v_all = k_all.to(device), v_all.to(device)
    cache = DynamicCache()
    for i in range(k_all.shape[0]):
        k, v = k_all[i][None], v_all[i][None]
        layer = DynamicLayer()
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
        cache.layers.append(layer)
    return cache


def drop_cache(cache: DynamicCache) -> None:
    """Free the cache's tensors (the tool call is running; the pages are stored)."""
    cache.reset()  # DynamicLayer.reset drops keys/values rather than zeroing them


def page_ranges(num_tokens: int, page_tokens: int) -> list[tuple[int, int]]:
    return [(s, min(s + page_tokens, num_tokens)) for s in range(0, num_tokens, page_tokens)]


def chain_hashes(token_ids: Sequence[int], page_tokens: int) -> list[bytes]:
    """Per page, a hash of every token up to the page's end (parent hash + own tokens)."""
    out, parent = [], _ROOT_HASH
    for start, end in page_ranges(len(token_ids), page_tokens):
        body = torch.tensor(list(token_ids[start:end]), dtype=torch.int64).numpy().tobytes()
        parent = hashlib.blake2b(parent + body, digest_size=16).digest()
        out.append(parent)
    return out
