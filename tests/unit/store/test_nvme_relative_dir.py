"""A shard opened with a relative directory keeps writing there after the process changes
its working directory: new segment files used to follow the ``chdir`` and were lost at the
next open."""

from __future__ import annotations

import os

from store.nvme import NvmeShard, NvmeShardConfig


def test_a_relative_shard_directory_survives_a_chdir(tmp_path, monkeypatch):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    (elsewhere / "shard").mkdir(parents=True)  # the new cwd holds a directory of that name
    home.mkdir()
    monkeypatch.chdir(home)
    config = NvmeShardConfig(segment_bytes=128 << 10)
    values = {b"k%d" % i: os.urandom(60_000) for i in range(8)}
    with NvmeShard("shard", config) as shard:
        assert shard.path == home / "shard"
        for i, (key, value) in enumerate(values.items()):
            if i == 3:
                os.chdir(elsewhere)  # a library the application calls changes the cwd
            shard.put(key, value, 1)
    assert list((elsewhere / "shard").iterdir()) == []
    with NvmeShard(home / "shard", config) as shard:
        assert sorted(shard.keys()) == sorted(values)
        assert all(shard.get(k) == v for k, v in values.items())
