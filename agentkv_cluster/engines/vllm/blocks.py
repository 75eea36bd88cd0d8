"""Block identity and block pages for the vLLM connector (pure, no vLLM import).

A vLLM KV block holds ``block_size`` tokens of every layer. Its AgentKV identity is a
`PageIdentity` whose fields pin everything the bytes depend on: model (weights and
dtype), tokenizer and RoPE versions, the LoRA adapter, the tenant (or the PUBLIC
namespace) and the **chain hash** of every token up to the block's end, chained like
vLLM's own block hashes (``h_i = H(h_{i-1} ‖ tokens of block i)``), but with a
deterministic seed so that two engines, or one engine after a restart, agree. vLLM
blocks are content-addressed and shared by every session of a tenant, so the chain hash
takes the identity's ``session`` slot (``"blk:<hex>"``); the agent session travels in
the hints and the events instead.

A block page is the store's page format (``store/page.py``): a header with the
identity digest, shape, dtype and a CRC-32 over header and payload, then the raw bytes.
``open_block`` refuses a page whose digest, geometry or checksum does not match.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from agentkv_cluster.lifecycle.identity import PageIdentity
from store.page import PageFormatError, pack_page, parse_page
from store.types import Codec

_PERSON = b"agentkv-vblk"
CHAIN_PREFIX = "blk:"


class BlockMismatch(ValueError):
    """A stored block page whose identity, geometry or checksum is not the expected one."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineVersions:
    """The engine-wide part of every block identity."""

    model_version: str
    tokenizer_version: str
    rope_config: str


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockGeometry:
    """Shape of one block across all layers: ``[layers, *per_layer]`` of ``dtype``."""

    layers: int
    per_layer: tuple[int, ...]  # one layer's block, e.g. (2, kv_heads, block_size, head_dim)
    dtype: str  # "float16" | "bfloat16" | "float32"

    @property
    def page_shape(self) -> tuple[int, ...]:
        """The shape written into the page header (at most 4 dims)."""
        if len(self.per_layer) <= 3:
            return (self.layers, *self.per_layer)
        numel = 1
        for d in self.per_layer:
            numel *= d
        return (self.layers, numel)


def chain_seed(salt: str = "") -> bytes:
    """The parent hash of a sequence's first block."""
    return hashlib.blake2b(salt.encode(), digest_size=16, person=_PERSON).digest()


def chain_next(parent: bytes, tokens: Sequence[int]) -> bytes:
    """``H(parent ‖ tokens)``: a full block, or a partial one (a tail: fewer tokens)."""
    chunk = array("q", tokens).tobytes()
    return hashlib.blake2b(parent + chunk, digest_size=16, person=_PERSON).digest()


def chain_hashes(tokens: Sequence[int], block_size: int, salt: str = "") -> list[bytes]:
    """16-byte chain hashes of every full block of ``tokens``; ``salt`` covers what else
    changes the KV of the same tokens (LoRA adapter, vLLM's ``cache_salt``)."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    parent = chain_seed(salt)
    out = []
    for i in range(len(tokens) // block_size):
        parent = chain_next(parent, tokens[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out


def block_identity(versions: EngineVersions, *, namespace: str, adapter: str, chain: bytes,
                   index: int, block_size: int, tokens: int | None = None) -> PageIdentity:
    """Block ``index``; ``tokens`` < ``block_size`` for a tail (the first tokens of a block
    that a finished request left partly filled; ``chain`` then covers only those)."""
    start = index * block_size
    return PageIdentity(
        model_version=versions.model_version, adapter_version=adapter,
        tokenizer_version=versions.tokenizer_version, rope_config=versions.rope_config,
        tenant=namespace, session=CHAIN_PREFIX + chain.hex(),
        start=start, end=start + (block_size if tokens is None else tokens), event_version=0)


def seal_block(identity: PageIdentity, geometry: BlockGeometry, payload: bytes | memoryview
               ) -> bytes:
    """The block page: header (identity digest, shape, CRC-32) + the raw KV bytes."""
    return pack_page(payload=payload, identity_digest=identity.digest(), codec=Codec.FULL,
                     k_shape=geometry.page_shape, v_shape=(), dtype=geometry.dtype,
                     token_start=identity.start, token_end=identity.end, generation=0)


def open_block(data: bytes | memoryview, identity: PageIdentity, geometry: BlockGeometry
               ) -> memoryview:
    """The payload of a block page, after every check; ``BlockMismatch`` otherwise."""
    try:
        header, payload = parse_page(data)
    except PageFormatError as exc:
        raise BlockMismatch(f"block page is damaged: {exc}") from None
    if header.identity_digest != identity.digest():
        raise BlockMismatch("block page belongs to another identity")
    if (header.codec is not Codec.FULL or header.k_shape != geometry.page_shape or
            header.dtype != geometry.dtype or
            (header.token_start, header.token_end) != (identity.start, identity.end)):
        raise BlockMismatch(f"block page geometry {header.k_shape} {header.dtype} does not "
                            f"match {geometry.page_shape} {geometry.dtype}")
    return payload
