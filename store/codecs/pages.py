"""Page bytes <-> codecs: a KV page is K then V, each [layers, kv_heads, tokens, head_dim].

The service stores a page FULL (its bytes as they are) or INT8/INT4 (``encode_kv`` on
the K and V views of its bytes). The page's geometry is any object with ``dtype``,
``nbytes()`` and ``dims()`` (the runtime's ``KvShape``); None means opaque bytes.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from store.codecs.kv import decode_kv, encode_kv
from store.codecs.spec import KV_DTYPES, CodecSpec, EncodedKV
from store.types import Codec

_SPECS = {Codec.INT8: CodecSpec.int8(), Codec.INT4: CodecSpec.int4()}


class KvGeometry(Protocol):
    """K then V, each [layers, kv_heads, tokens, head_dim] of ``dtype``."""

    @property
    def dtype(self) -> str: ...

    def nbytes(self) -> int:
        """Bytes of K and V together."""
        ...

    def dims(self) -> list[int]:
        """[layers, kv_heads, tokens, head_dim]."""
        ...


class UnsupportedCodec(ValueError):
    """A lossy codec asked for a page without KV geometry, or a codec the service never uses."""


def _kv_views(raw: np.ndarray, shape: KvGeometry) -> tuple[torch.Tensor, torch.Tensor]:
    half = shape.nbytes() // 2
    dims = tuple(shape.dims())
    flat = torch.from_numpy(raw[: 2 * half])
    k = flat[:half].view(KV_DTYPES[shape.dtype]).reshape(dims)
    v = flat[half:].view(KV_DTYPES[shape.dtype]).reshape(dims)
    return k, v


def spec_for(codec: Codec) -> CodecSpec:
    spec = _SPECS.get(codec)
    if spec is None:
        raise UnsupportedCodec(f"the service stores pages FULL, INT8 or INT4, not {codec.name}")
    return spec


def encode_page(raw: np.ndarray, length: int, shape: KvGeometry | None, codec: Codec,
                out: np.ndarray) -> int:
    """Write ``raw`` (the full page, ``length`` bytes) in ``codec`` form into ``out``;
    returns bytes written."""
    if codec is Codec.FULL:
        out[:length] = raw[:length]
        return length
    if shape is None:
        raise UnsupportedCodec("a page without KV geometry can only be stored FULL")
    k, v = _kv_views(raw, shape)
    return encode_kv(k, v, spec_for(codec)).write_into(out)


def decode_into(src: np.ndarray, shape: KvGeometry | None, dst: np.ndarray) -> None:
    """Decode an encoded page in ``src`` into full-precision bytes in ``dst``: straight
    into its K and V views, with no tensors allocated for them and no copy after."""
    if shape is None:
        raise UnsupportedCodec("a page without KV geometry has no lossy form")
    decode_kv(EncodedKV.from_bytes(src), out=_kv_views(dst, shape))
