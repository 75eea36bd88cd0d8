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

import hashlib
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from agentkv_cluster.engines.errors import (
    ContextTooLong,
    CorruptPage,
    EmptyInput,
    EngineAdapterError,
    InvalidForms,
    InvalidTokens,
    UnsupportedCache,
)
from agentkv_cluster.engines.forward import (
    check_context,
    greedy_decode,
    max_positions,
    model_device,
    prefill,
    token_list,
)
from agentkv_cluster.engines.model import LoadedModel
from agentkv_cluster.engines.pages import (
    cache_to_kv,
    chain_hashes,
    drop_cache,
    page_ranges,
    pages_to_cache,
)
from agentkv_cluster.lifecycle.identity import PageIdentity
from store.codecs import CodecSpec, EncodedFormatError, EncodedKV, decode_kv, encode_kv
from store.types import Codec, Lookup

if TYPE_CHECKING:
    from agentkv_cluster.engines.page_store import PageStore

# The errors, the page helpers and the forward helpers live in their own modules; they
# stay importable from here, where the adapter's callers look for them.
__all__ = [
    "AdapterConfig", "ContextTooLong", "CorruptPage", "DynamicCache", "EmptyInput",
    "EngineAdapterError", "HfKVAdapter", "InvalidForms", "InvalidTokens", "RestoreResult", "StoreReceipt", "StoredPage",
    "UnsupportedCache", "cache_to_kv", "chain_hashes", "check_context", "drop_cache",
    "greedy_decode", "max_positions", "model_device", "page_ranges", "pages_to_cache",
    "prefill", "token_list",
]

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
    """A rebuilt cache and where its tokens came from.

    ``forms`` names, page by page in token order, the form each page of the cache came
    in: the codec of a restored page (``Codec.FULL`` is exact, the others are lossy
    working copies that need the verifier for exact output), ``Codec.RECOMPUTE`` for a
    page rebuilt by prefill. Pages neither restored nor recomputed (``recompute=False``)
    are not in the cache and have no entry."""

    cache: DynamicCache
    restored_tokens: int
    recomputed_tokens: int
    pages_hit: int
    bytes_read: int
    logits: torch.Tensor | None = None  # last-position logits when tokens were recomputed
    seconds: float = 0.0
    forms: tuple[Codec, ...] = ()

    @property
    def exact(self) -> bool:
        """Whether every token of the cache is full precision (no lossy page in it)."""
        return not any(form.is_lossy for form in self.forms)


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
        if not specs:
            raise InvalidForms("no forms to store the pages in (specs is empty)")
        if any(spec.codec is Codec.RECOMPUTE for spec in specs):
            raise InvalidForms("RECOMPUTE holds no KV: restore recomputes pages that are not stored")
        token_ids = token_list(token_ids)
        self._check_model()
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
                page = StoredPage(identity=ident, key=key, spec=spec, nbytes=len(blob),
                                  checksum=zlib.crc32(blob))
                written = self._put(page, blob)
                table.pages[(chain, _spec_tag(spec))] = page
                stored.append(page)
                if written:
                    fresh.append(page)
                    nbytes += len(blob)
        return StoreReceipt(session=session, tokens=len(token_ids), pages=tuple(stored),
                            fresh=tuple(fresh), bytes_written=nbytes,
                            seconds=time.perf_counter() - t0)

    def _put(self, page: StoredPage, blob: bytes) -> bool:
        """Write ``page``; False if the store already held these very bytes under its key.

        A store keeps the first bytes put under a key. Another writer of the same page
        (same tenant, session, tokens and event) may have put other bytes there: the
        model in another dtype, or on another device. Those are not this page's KV."""
        found, held = self._store.get(page.key)  # MISS for a key it does not hold
        if found is Lookup.HIT:
            if zlib.crc32(held) == page.checksum:
                return False
            raise UnsupportedCache(
                f"the store holds other bytes under page [{page.identity.start}, "
                f"{page.identity.end}) of session {page.identity.session!r} (written by "
                "this model in another dtype or on another device?): use another session")
        self._store.put(page.key, blob, page.identity)
        return True

    def restore(
        self,
        session: str,
        token_ids: Sequence[int],
        *,
        spec: CodecSpec | None = None,
        recompute: bool = True,
    ) -> RestoreResult:
        """Rebuild the cache for ``token_ids``: the longest resident prefix of pages in
        form ``spec``, then (if ``recompute``) a prefill of the remaining tokens.

        A page that fails its checks raises `CorruptPage` and is dropped (from the page
        table and the store), so the next restore recomputes from it."""
        t0 = time.perf_counter()
        spec = spec or CodecSpec.full()
        model = self._loaded.model
        token_ids = token_list(token_ids)
        if not token_ids:
            raise EmptyInput("no tokens to restore")
        self._check_model()
        check_context(model, len(token_ids))
        ks, vs, forms, restored, nbytes = self._read_prefix(session, token_ids, spec)
        # Pages are decoded on the host and moved once, onto the model's device.
        cache = pages_to_cache(ks, vs, model_device(model)) if ks else DynamicCache()
        logits, missing = None, len(token_ids) - restored
        if recompute and missing:
            logits = prefill(model, token_ids[restored:], cache)[-1]
            recomputed = len(page_ranges(len(token_ids), self._config.page_tokens)) - len(ks)
            forms += [Codec.RECOMPUTE] * recomputed
        return RestoreResult(cache=cache, restored_tokens=restored,
                             recomputed_tokens=missing if recompute else 0,
                             pages_hit=len(ks), bytes_read=nbytes, logits=logits,
                             seconds=time.perf_counter() - t0, forms=tuple(forms))

    def _read_prefix(self, session: str, token_ids: Sequence[int], spec: CodecSpec):
        table = self._tables.get(session, _SessionTable())
        ranges = page_ranges(len(token_ids), self._config.page_tokens)
        ks, vs, forms, restored, nbytes = [], [], [], 0, 0
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
            try:
                enc = self._decode(page, blob, want)
            except CorruptPage:  # never kept: the next restore recomputes from this page
                del table.pages[(chain, _spec_tag(spec))]
                self._store.delete(page.key)
                raise
            ks.append(enc[0])
            vs.append(enc[1])
            forms.append(page.spec.codec)
            restored, nbytes = end, nbytes + len(blob)
        return ks, vs, forms, restored, nbytes

    def _decode(self, page: StoredPage, blob, want: PageIdentity
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``page`` from its stored bytes, or `CorruptPage`."""
        start, end = want.start, want.end
        if zlib.crc32(blob) != page.checksum:
            raise CorruptPage(f"page {page.key.hex()} [{start}, {end}) changed in the store "
                              "since it was written (checksum mismatch)")
        try:
            enc = EncodedKV.from_bytes(blob)
        except EncodedFormatError as exc:
            raise CorruptPage(f"page {page.key.hex()} is not encoded KV: {exc}") from exc
        if enc.identity != want.pack() or enc.spec != page.spec:
            raise CorruptPage(f"slot for page {page.key.hex()} holds another page's bytes")
        if enc.spec.codec is Codec.FULL:  # from_bytes already copied out of the store
            k, v = enc.tensors["k"], enc.tensors["v"]
        else:
            k, v = decode_kv(enc)
        self._check_shape(k, end - start, page)
        self._check_shape(v, end - start, page)
        return k, v

    def _check_model(self) -> None:
        """Refuse a model that no longer is the one loaded (cast to another dtype, or
        another model put in its place): its pages would not fit it."""
        if (drift := self._loaded.drift()) is not None:
            raise UnsupportedCache(f"the model changed since it was loaded ({drift}); its "
                                   "pages fit the model as loaded: load it again")

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
