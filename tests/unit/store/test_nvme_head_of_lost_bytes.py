"""A record whose bytes are gone from the file (cut off behind
the shard's back) has no head: ``read_head`` is a MISS rather than whatever the caller's
buffer held, and ``prune`` retires the record even when ``keep`` would keep it."""

from __future__ import annotations

import os

from store.nvme import NvmeShard
from store.types import Lookup


def _cut(tmp_path, loc, keep_bytes):
    path = tmp_path / "seg-00000000.akv"
    os.truncate(path, loc.payload_offset + keep_bytes)


def test_read_head_of_a_record_cut_short_is_a_miss(tmp_path):
    with NvmeShard(tmp_path) as shard:
        loc = shard.put(b"k", b"A" * 10000, 0)
        _cut(tmp_path, loc, 100)
        out = memoryview(bytearray(b"Z" * 4096))
        assert shard.read_head(b"k", out) is Lookup.MISS
        assert shard.get(b"k") is Lookup.MISS


def test_read_head_of_a_record_cut_at_its_payload_is_a_miss(tmp_path):
    with NvmeShard(tmp_path) as shard:
        loc = shard.put(b"k", b"A" * 10000, 0)
        _cut(tmp_path, loc, 0)
        assert shard.read_head(b"k", memoryview(bytearray(b"Z" * 64))) is Lookup.MISS


def test_prune_retires_a_record_whose_head_cannot_be_read(tmp_path):
    with NvmeShard(tmp_path) as shard:
        shard.put(b"whole", b"W" * 3000, 0)
        loc = shard.put(b"cut", b"A" * 10000, 0)
        _cut(tmp_path, loc, 100)
        assert shard.prune(lambda key, head, length: True, head_bytes=4096) == 1
        assert shard.keys() == [b"whole"]
        assert shard.get(b"whole") == b"W" * 3000
