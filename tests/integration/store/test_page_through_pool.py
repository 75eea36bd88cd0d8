"""A codec page end to end: encode, frame, host pool slot, second handle, parse, decode."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import torch

from store.codecs import CodecSpec, EncodedKV, decode_kv, encode_kv
from store.host_pool import HostPool
from store.page import BadChecksum, pack_encoded, parse_page
from store.types import Codec


@pytest.fixture
def pool():
    p = HostPool.create(f"akv-page-{os.getpid()}-{uuid.uuid4().hex[:8]}", 1 << 20, 2)
    yield p
    p.close()
    p.unlink()


@pytest.mark.parametrize("spec", [CodecSpec.full(), CodecSpec.int4()], ids=lambda s: s.label)
def test_page_survives_the_pool_bit_for_bit(pool, spec):
    g = torch.Generator().manual_seed(2)
    k, v = (
        torch.randn(30, 3, 32, 64, generator=g).half(),
        torch.randn(30, 3, 32, 64, generator=g).half(),
    )
    enc = encode_kv(k, v, spec)
    page = pack_encoded(
        enc, identity_digest=b"\x07" * 32, token_start=0, token_end=32, generation=3
    )
    slot = pool.alloc()
    pool.write(slot, page)
    out = np.empty(pool.slot_bytes, dtype=np.uint8)
    with HostPool.attach(pool.name) as reader:
        header, payload = parse_page(reader.read(slot, out=out))
    assert header.codec is spec.codec and header.generation == 3
    for a, b in zip(decode_kv(enc), decode_kv(EncodedKV.from_bytes(payload))):
        assert torch.equal(a, b)
    if spec.codec is Codec.FULL:
        assert torch.equal(decode_kv(EncodedKV.from_bytes(payload))[0], k)


def test_corrupted_slot_bytes_are_caught_by_the_page_checksum(pool):
    page = pack_encoded(
        encode_kv(torch.ones(1, 1, 32, 64), torch.ones(1, 1, 32, 64), CodecSpec.int8()),
        identity_digest=bytes(32),
        token_start=0,
        token_end=32,
        generation=1,
    )
    slot = pool.alloc()
    pool.write(slot, page)
    fd = os.open(f"/dev/shm/{pool.name}", os.O_RDWR)  # bit rot, through the real file
    try:
        at = pool.slot_offset(slot) + len(page) - 3
        os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0xFF]), at)
    finally:
        os.close(fd)
    with pytest.raises(BadChecksum):
        parse_page(pool.read(slot))
