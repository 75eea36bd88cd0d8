"""The append path's reused header block: every record's padding is zero, whatever came before."""

from __future__ import annotations

from store.nvme import NvmeShard, NvmeShardConfig
from store.nvme import format as fmt
from store.types import Lookup


def test_a_short_key_after_a_long_one_leaves_a_clean_header_block(tmp_path):
    keys = [b"L" * 255, b"s", b"m" * 40, b"t"]
    with NvmeShard(tmp_path, NvmeShardConfig(align=512)) as shard:
        locs = [shard.put(key, bytes([i]) * 100, i) for i, key in enumerate(keys)]
    raw = (tmp_path / "seg-00000000.akv").read_bytes()
    for key, loc in zip(keys, locs, strict=True):
        block = raw[loc.offset : loc.payload_offset]
        assert len(block) == fmt.header_block(len(key), 512)
        assert fmt.parse_header(block).key == key
        assert block[fmt.HEADER.size + len(key) :] == bytes(len(block) - fmt.HEADER.size - len(key))
    with NvmeShard(tmp_path, NvmeShardConfig(align=512)) as again:  # recovery finds them all
        assert [again.get(k) for k in keys] == [bytes([i]) * 100 for i in range(4)]
        assert again.locate(b"s") == (Lookup.HIT, locs[1])
