"""Compaction and erasure sync what they wrote whatever the
fsync policy: compaction's copies before the old segment file goes (a crash then still finds
every live record), and zeroed payloads before the call returns (an erasure that is not on
the disk is not one). Seen through ``stats().syncs`` on a shard whose policy never syncs."""

from __future__ import annotations

from store.nvme import FsyncPolicy, NvmeShard, NvmeShardConfig

NEVER = NvmeShardConfig(fsync=FsyncPolicy.NONE, segment_bytes=64 << 10)


def test_compaction_syncs_its_copies_before_each_old_segment_goes(tmp_path):
    with NvmeShard(tmp_path, NEVER) as shard:
        for i in range(40):
            shard.put(bytes([i + 1]), bytes([i]) * 8000, 0)
        for i in range(0, 40, 2):
            shard.delete(bytes([i + 1]))
        assert shard.stats().syncs == 0  # the policy syncs nothing
        report = shard.compact(0.3)
        assert report.segments_removed > 1
        assert shard.stats().syncs >= report.segments_removed
        assert [shard.get(bytes([i + 1])) for i in range(1, 40, 2)] == \
            [bytes([i]) * 8000 for i in range(1, 40, 2)]


def test_shred_syncs_the_zeroed_payload(tmp_path):
    with NvmeShard(tmp_path, NEVER) as shard:
        loc = shard.put(b"secret", b"s" * 5000, 0)
        shard.shred(b"secret")
        assert shard.stats().syncs >= 1
    raw = (tmp_path / "seg-00000000.akv").read_bytes()
    assert raw[loc.payload_offset : loc.payload_offset + 5000] == bytes(5000)


def test_shred_dead_syncs_the_segments_it_zeroed(tmp_path):
    with NvmeShard(tmp_path, NEVER) as shard:
        old = shard.put(b"k", b"o" * 5000, 0)
        shard.put(b"k", b"n" * 5000, 0)  # the old record stays in the file, superseded
        assert shard.shred_dead() == 1
        assert shard.stats().syncs >= 1
        assert shard.get(b"k") == b"n" * 5000
    raw = (tmp_path / "seg-00000000.akv").read_bytes()
    assert raw[old.payload_offset : old.payload_offset + 5000] == bytes(5000)
