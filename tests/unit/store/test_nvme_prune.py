"""NvmeShard.prune: records a caller can no longer use leave the index, for good."""

from __future__ import annotations

from store.nvme import NvmeShard, NvmeShardConfig
from store.types import Lookup


def test_prune_retires_what_keep_refuses_and_hands_it_each_head(tmp_path):
    seen: dict[bytes, tuple[bytes, int]] = {}

    def keep(key: bytes, head: memoryview, length: int) -> bool:
        seen[key] = (bytes(head), length)
        return not bytes(head).startswith(b"DROP")

    with NvmeShard(tmp_path, NvmeShardConfig()) as shard:
        shard.put(b"a", b"KEEP" + bytes(10_000), 1)
        shard.put(b"b", b"DROP" + bytes(20_000), 1)
        shard.put(b"c", b"DR", 1)  # shorter than the head: its whole payload is the head
        shard.put(b"d", b"", 1)
        assert shard.prune(keep, head_bytes=8) == 1
        assert seen == {b"a": (b"KEEP" + bytes(4), 10_004), b"b": (b"DROP" + bytes(4), 20_004),
                        b"c": (b"DR", 2), b"d": (b"", 0)}
        assert shard.get(b"b") is Lookup.MISS and sorted(shard.keys()) == [b"a", b"c", b"d"]
    with NvmeShard(tmp_path, NvmeShardConfig()) as shard:  # a tombstone: gone after a restart
        assert sorted(shard.keys()) == [b"a", b"c", b"d"]
        assert shard.get(b"a") == b"KEEP" + bytes(10_000)


def test_prune_keeping_everything_changes_nothing(tmp_path):
    with NvmeShard(tmp_path, NvmeShardConfig()) as shard:
        for i in range(5):
            shard.put(b"k%d" % i, bytes([i]) * 5000, 1)
        before = shard.stats()
        assert shard.prune(lambda key, head, length: True, head_bytes=64) == 0
        assert shard.stats() == before
