"""store.codecs.pages: a page's bytes in FULL, INT8 and INT4 form and back, for any KV
geometry object (the store needs nothing of the runtime's records)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from store.codecs.pages import UnsupportedCodec, decode_into, encode_page
from store.types import Codec


@dataclass(frozen=True)
class Geometry:
    layers: int = 2
    kv_heads: int = 2
    tokens: int = 64
    head_dim: int = 32
    dtype: str = "float16"

    def dims(self) -> list[int]:
        return [self.layers, self.kv_heads, self.tokens, self.head_dim]

    def nbytes(self) -> int:
        return 2 * 2 * self.layers * self.kv_heads * self.tokens * self.head_dim


def _page(shape: Geometry) -> np.ndarray:
    values = np.random.default_rng(5).standard_normal(shape.nbytes() // 2).astype(np.float16)
    return values.view(np.uint8)


def test_full_is_the_bytes_as_they_are():
    shape = Geometry()
    raw = _page(shape)
    out = np.zeros(raw.size + 100, np.uint8)
    assert encode_page(raw, raw.size, None, Codec.FULL, out) == raw.size
    assert bytes(out[: raw.size]) == raw.tobytes() and not out[raw.size:].any()


@pytest.mark.parametrize(("codec", "tolerance"), [(Codec.INT8, 0.05), (Codec.INT4, 0.6)])
def test_lossy_forms_are_smaller_and_decode_close_to_the_page(codec, tolerance):
    shape = Geometry()
    raw = _page(shape)
    out = np.zeros(2 * raw.size, np.uint8)
    n = encode_page(raw, raw.size, shape, codec, out)
    assert 0 < n < raw.size
    back = np.zeros(raw.size, np.uint8)
    decode_into(out[:n], shape, back)
    err = np.abs(back.view(np.float16).astype(np.float32) - raw.view(np.float16))
    assert err.max() < tolerance and err.mean() < tolerance / 4
    assert back.tobytes() != raw.tobytes()  # lossy: the control that the codec ran


@pytest.mark.parametrize("codec", [Codec.INT8, Codec.INT4])
def test_a_page_decodes_in_place_into_its_span_of_a_larger_buffer(codec):
    """The HBM actor decodes into the page's span of its arena: the bytes match a
    stand-alone decode and nothing beside the span is written."""
    shape = Geometry()
    raw = _page(shape)
    out = np.zeros(2 * raw.size, np.uint8)
    n = encode_page(raw, raw.size, shape, codec, out)
    alone = np.zeros(raw.size, np.uint8)
    decode_into(out[:n], shape, alone)
    arena = np.full(raw.size + 8192, 0xAB, np.uint8)
    decode_into(out[:n], shape, arena[4096:4096 + raw.size])
    assert arena[4096:4096 + raw.size].tobytes() == alone.tobytes()
    assert (arena[:4096] == 0xAB).all() and (arena[4096 + raw.size:] == 0xAB).all()


def test_a_page_without_geometry_or_an_unused_codec_is_refused():
    raw = _page(Geometry())
    out = np.zeros(raw.size, np.uint8)
    with pytest.raises(UnsupportedCodec):
        encode_page(raw, raw.size, None, Codec.INT8, out)
    with pytest.raises(UnsupportedCodec):
        decode_into(out, None, out)
    with pytest.raises(UnsupportedCodec):
        encode_page(raw, raw.size, Geometry(), Codec.LOW_RANK, out)
