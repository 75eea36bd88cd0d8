"""Encoded KV of an unknown wire version is refused with a
clear error, not parsed as if it were this version's layout."""

from __future__ import annotations

import struct

import pytest
import torch

from store.codecs import CodecSpec, EncodedFormatError, EncodedKV, encode_kv


def _wire() -> bytes:
    g = torch.Generator().manual_seed(0)
    k = torch.randn(2, 2, 40, 64, generator=g).to(torch.float16)
    v = torch.randn(2, 2, 40, 64, generator=g).to(torch.float16)
    return encode_kv(k, v, CodecSpec.int8()).to_bytes()


@pytest.mark.parametrize("version", [0, 2, 0xFFFF])
def test_an_unknown_wire_version_is_refused(version):
    wire = bytearray(_wire())
    assert EncodedKV.from_bytes(wire).spec == CodecSpec.int8()  # the intact one parses
    struct.pack_into("<H", wire, 4, version)
    with pytest.raises(EncodedFormatError, match=f"version {version}, expected 1"):
        EncodedKV.from_bytes(wire)
