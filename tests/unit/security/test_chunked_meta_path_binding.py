"""Opening a format-2 record with its meta block already
read (``open_into(..., meta=)`` and ``opener``: the path store/kv_sealing.py and
runtime/pool_records.py take) must refuse a binding whose slot id is not the record's:
the chunks' AAD is built from the record's own preamble, so the slot-id comparison in
``ChunkedSealer._chunk_key`` is the only thing that binds the caller's slot id there."""

from __future__ import annotations

import os

import numpy as np
import pytest

from security.chunked import Binding, ChunkedSealer, record_size
from security.errors import InvalidSeal

SLOT_A, SLOT_B = bytes(range(100, 132)), bytes(range(1, 33))
DIGEST = bytes(range(32))


def bind(slot: bytes) -> Binding:
    return Binding(tenant="alice", generation=1, tier=1, slot_id=slot, digest=DIGEST, location=7)


@pytest.mark.parametrize("n", [1000, 300_000])  # one chunk, and several
def test_a_record_read_meta_first_does_not_open_under_another_slot(keyring, n) -> None:
    sealer = ChunkedSealer(keyring, threads=2)
    page = os.urandom(n)
    record = bytearray(record_size(n))
    sealer.seal_into(record, page, bind(SLOT_A))
    meta = sealer.read_meta(record, 1, "alice", 1)
    assert bytes(sealer.open_into(record, bind(SLOT_A), meta=meta)) == page  # control
    out = np.full(n, 0xAA, np.uint8)
    with pytest.raises(InvalidSeal):
        sealer.open_into(record, bind(SLOT_B), out, meta=meta)
    assert not out.any()  # nothing of the page (nor the old bytes) is left behind
    open_chunk = sealer.opener(record, meta, bind(SLOT_B))
    for i, (_off, length) in enumerate(meta.parts()):
        buf = np.full(length, 0xAA, np.uint8)
        assert open_chunk(i, buf) is False
        assert page[_off:_off + length] != bytes(buf)
