"""Page format: round trips and specific errors for every kind of damage."""

from __future__ import annotations

import struct

import pytest
import torch

from store.codecs import CodecSpec, EncodedKV, decode_kv, encode_kv
from store.page import (
    FORMAT_VERSION,
    HEADER_SIZE,
    BadChecksum,
    BadMagic,
    Oversized,
    PageFormatError,
    Truncated,
    WrongVersion,
    pack_encoded,
    pack_page,
    parse_header,
    parse_page,
)
from store.types import Codec

DIGEST = bytes(range(32))
FIELDS = {
    "identity_digest": DIGEST,
    "codec": Codec.INT4,
    "k_shape": (30, 3, 128, 64),
    "v_shape": (30, 3, 128, 64),
    "dtype": "float16",
    "token_start": 256,
    "token_end": 384,
    "generation": 7,
}


def test_round_trip_keeps_every_field_and_payload():
    payload = bytes(range(256)) * 40
    page = pack_page(payload=payload, **FIELDS)
    assert len(page) == HEADER_SIZE + len(payload)
    header, body = parse_page(page)
    assert bytes(body) == payload
    assert header.format_version == FORMAT_VERSION and header.identity_digest == DIGEST
    assert header.codec is Codec.INT4 and header.dtype == "float16"
    assert header.k_shape == (30, 3, 128, 64) and header.v_shape == (30, 3, 128, 64)
    assert (header.token_start, header.token_end, header.generation) == (256, 384, 7)
    assert header.payload_len == len(payload) and header.page_len == len(page)


def test_encoded_kv_page_decodes_to_the_same_tensors():
    k = torch.randn(2, 3, 40, 64).half()
    enc = encode_kv(k, k * 2, CodecSpec.int8())
    page = pack_encoded(enc, identity_digest=DIGEST, token_start=0, token_end=40, generation=1)
    header, payload = parse_page(bytearray(page))
    assert (
        header.codec is Codec.INT8
        and header.k_shape == (2, 3, 40, 64)
        and header.dtype == "float16"
    )
    for a, b in zip(decode_kv(enc), decode_kv(EncodedKV.from_bytes(payload))):
        assert torch.equal(a, b)


def test_empty_shapes_for_recompute_entries():
    header, body = parse_page(pack_page(payload=b"ids", **{**FIELDS, "k_shape": (), "v_shape": ()}))
    assert header.k_shape == () and bytes(body) == b"ids"


def test_truncation_anywhere_is_reported_as_truncated():
    page = pack_page(payload=b"x" * 1000, **FIELDS)
    for cut in (0, 3, HEADER_SIZE - 1, HEADER_SIZE, len(page) - 1):
        with pytest.raises(Truncated):
            parse_page(page[:cut])


def test_trailing_bytes_and_absurd_lengths_are_oversized():
    page = pack_page(payload=b"x" * 100, **FIELDS)
    with pytest.raises(Oversized, match="buffer holds"):
        parse_page(page + b"\0")
    huge = bytearray(page)
    struct.pack_into("<Q", huge, HEADER_SIZE - 4 - 32 - 8, 1 << 40)
    with pytest.raises(Oversized, match="payload_len"):
        parse_header(huge)


def test_wrong_version_and_magic():
    page = bytearray(pack_page(payload=b"abc", **FIELDS))
    struct.pack_into("<H", page, 4, FORMAT_VERSION + 1)
    with pytest.raises(WrongVersion):
        parse_page(page)
    with pytest.raises(BadMagic):
        parse_page(b"NOPE" + bytes(page[4:]))


@pytest.mark.parametrize("offset", [8, 20, HEADER_SIZE - 30, HEADER_SIZE - 2, HEADER_SIZE + 10])
def test_any_flipped_bit_fails_checksum(offset):
    page = bytearray(pack_page(payload=bytes(64), **FIELDS))
    page[offset] ^= 0x10
    with pytest.raises(PageFormatError) as info:
        parse_page(page)
    assert isinstance(info.value, (BadChecksum, Oversized, Truncated))
    if offset >= HEADER_SIZE - 36:  # digest, checksum and payload: only the CRC can tell
        assert isinstance(info.value, BadChecksum)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"identity_digest": b"short"}, "32 bytes"),
        ({"dtype": "int8"}, "dtype"),
        ({"token_start": 10, "token_end": 5}, "token range"),
        ({"generation": -1}, "generation"),
        ({"k_shape": (1, 2, 3, 4, 5)}, "4 dims"),
    ],
)
def test_bad_fields_are_rejected_at_pack_time(change, match):
    with pytest.raises(ValueError, match=match):
        pack_page(payload=b"", **{**FIELDS, **change})
