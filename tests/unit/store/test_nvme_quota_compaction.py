"""A shard at its quota reclaims retired space instead of staying full for good.

Nothing in the service calls ``compact()``; before, a shard whose files reached
``max_bytes`` refused every put (``DiskFull``) for as long as it lived, even with most of
its records deleted, and ``compact()`` itself failed there because its copies counted
against the quota.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from store.nvme import DiskFull, NvmeShard, NvmeShardConfig, QuotaFull

MIB = 1 << 20
PAYLOAD = bytes(range(256)) * (MIB // 256)


def _config(**kw: object) -> NvmeShardConfig:
    return NvmeShardConfig(segment_bytes=4 * MIB, max_bytes=8 * MIB, **kw)  # type: ignore[arg-type]


def _fill(shard: NvmeShard) -> list[bytes]:
    """Put 1 MiB records until the quota refuses one; the keys stored."""
    keys: list[bytes] = []
    with pytest.raises(QuotaFull):
        for i in range(64):
            shard.put(f"k{i}".encode(), PAYLOAD, 1)
            keys.append(f"k{i}".encode())
    return keys


def _full_with_holes(shard: NvmeShard) -> list[bytes]:
    """Fill ``shard`` to its quota, then delete every other record; the keys kept."""
    keys = _fill(shard)
    for key in keys[::2]:
        shard.delete(key)
    return keys[1::2]


def _segment_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("seg-*.akv"))


def test_a_full_shard_with_retired_records_takes_new_puts(tmp_path: Path) -> None:
    shard = NvmeShard(tmp_path, _config())
    kept = _full_with_holes(shard)
    for j in range(24):  # far more than the quota over its life
        shard.put(f"new{j}".encode(), PAYLOAD, 2)
        assert _segment_bytes(tmp_path) <= 8 * MIB + 4 * MIB  # quota + one segment's copies
        shard.delete(f"new{j}".encode())
    shard.put(b"last", PAYLOAD, 3)
    assert all(shard.get(key) == PAYLOAD for key in [*kept, b"last"])
    shard.close()
    again = NvmeShard(tmp_path, _config())  # what a restart recovers
    assert sorted(again.keys()) == sorted([*kept, b"last"])
    assert all(again.get(key) == PAYLOAD for key in [*kept, b"last"])
    again.close()


def test_compact_runs_on_a_full_shard(tmp_path: Path) -> None:
    shard = NvmeShard(tmp_path, _config(compact_on_full=False))
    kept = _full_with_holes(shard)
    before = shard.stats().file_bytes
    report = shard.compact(0.3)
    assert report.segments_removed >= 1 and report.records_dropped == 0
    assert shard.stats().file_bytes < before
    shard.put(b"fits-now", PAYLOAD, 2)
    assert all(shard.get(key) == PAYLOAD for key in [*kept, b"fits-now"])
    shard.close()


def test_without_compact_on_full_the_quota_is_final(tmp_path: Path) -> None:
    shard = NvmeShard(tmp_path, _config(compact_on_full=False))
    kept = _full_with_holes(shard)
    segments = shard.stats().segments
    with pytest.raises(QuotaFull):
        shard.put(b"more", PAYLOAD, 2)
    assert shard.stats().segments == segments  # nothing was compacted
    assert all(shard.get(key) == PAYLOAD for key in kept)
    shard.close()


def test_when_retired_space_cannot_make_room_nothing_is_moved(tmp_path: Path) -> None:
    shard = NvmeShard(tmp_path, _config())
    keys = _fill(shard)
    shard.delete(keys[0])  # 1 MiB retired: not enough for a 4 MiB record
    used = _segment_bytes(tmp_path)
    with pytest.raises(QuotaFull) as info:
        shard.put(b"big", PAYLOAD * 4, 2)
    assert info.value.over > MIB
    assert _segment_bytes(tmp_path) == used  # no copies made, no file removed
    assert all(shard.get(key) == PAYLOAD for key in keys[1:])
    shard.close()


def test_quota_full_is_a_disk_full_that_crosses_processes() -> None:
    err = pickle.loads(pickle.dumps(QuotaFull(100, 90, 20)))
    assert isinstance(err, DiskFull)
    assert (err.quota, err.used, err.need, err.over) == (100, 90, 20, 10)
    assert str(err) == "shard quota 100 B: 90 B used, record needs 20 B"
