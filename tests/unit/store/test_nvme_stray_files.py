"""Files in a shard directory that the shard did not name are neither read nor changed:
an operator's copy of a segment (``seg-00000000.old.akv``) or a short name
(``seg-5.akv``) used to stop the shard from opening (``ValueError``) or to be taken for a
segment whose file was then another one."""

from __future__ import annotations

import shutil
from pathlib import Path

from store.nvme import NvmeShard


def test_stray_segment_like_files_are_left_alone(tmp_path: Path) -> None:
    shard_dir = tmp_path / "shard"
    with NvmeShard(shard_dir) as shard:
        shard.put(b"k", b"v" * 10, 1)
    copy = shard_dir / "seg-00000000.old.akv"
    shutil.copy(shard_dir / "seg-00000000.akv", copy)
    short = shard_dir / "seg-5.akv"
    short.write_bytes(b"not a segment")
    before = {p.name: p.read_bytes() for p in (copy, short)}
    with NvmeShard(shard_dir) as shard:
        assert shard.get(b"k") == b"v" * 10
        assert shard.stats().segments == 1
        shard.put(b"k2", b"x", 1)
    assert sorted(p.name for p in shard_dir.iterdir()) == [
        "LOCK", "seg-00000000.akv", "seg-00000000.old.akv", "seg-5.akv"]
    assert {p.name: p.read_bytes() for p in (copy, short)} == before
    with NvmeShard(shard_dir) as shard:
        assert shard.get(b"k2") == b"x"


def test_segments_open_in_index_order(tmp_path: Path) -> None:
    with NvmeShard(tmp_path / "s") as shard:
        shard.put(b"k", b"a", 1)
    (tmp_path / "s" / "seg-00000000.akv").rename(tmp_path / "s" / "seg-00000009.akv")
    with NvmeShard(tmp_path / "s") as shard:  # the newest index is the active segment
        shard.put(b"k", b"b", 1)
    with NvmeShard(tmp_path / "s") as shard:
        assert shard.get(b"k") == b"b"
        assert sorted(p.name for p in (tmp_path / "s").glob("seg-*")) == ["seg-00000009.akv"]
