"""An NVMe shard whose directory cannot be used: the open fails with ``ShardUnavailable``
(a ``ShardError`` and an ``OSError`` with the cause's errno), naming the directory, and
leaves nothing behind."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from store.nvme import NvmeShard, ShardError, ShardLocked, ShardUnavailable

pytestmark = pytest.mark.integration


def _refused(path: Path, err: int) -> ShardUnavailable:
    with pytest.raises(ShardUnavailable) as caught:
        NvmeShard(path)
    exc = caught.value
    assert isinstance(exc, ShardError) and isinstance(exc, OSError)
    assert exc.errno == err
    assert f"cannot open NVMe shard {path}" in str(exc)
    return exc


def test_a_shard_under_a_file_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    _refused(tmp_path / "afile" / "shard", errno.ENOTDIR)
    assert (tmp_path / "afile").read_text() == "x"


def test_a_shard_that_is_a_file_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    exc = _refused(tmp_path / "afile", errno.EEXIST)
    assert exc.errno == errno.EEXIST


@pytest.fixture
def read_only_copy(tmp_path: Path):
    """A shard with a record, then its file system remounted read-only."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        with NvmeShard(mnt / "shard") as shard:
            shard.put(b"k", b"v" * 100, 1)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_shard_on_a_read_only_file_system_is_unavailable(read_only_copy: Path) -> None:
    _refused(read_only_copy / "shard", errno.EROFS)
    _refused(read_only_copy / "new", errno.EROFS)


@pytest.mark.skipif(os.geteuid() == 0, reason="root opens a mode-000 directory anyway")
def test_a_shard_the_process_may_not_open_is_unavailable(tmp_path: Path) -> None:
    with NvmeShard(tmp_path / "shard") as shard:
        shard.put(b"k", b"v", 1)
    (tmp_path / "shard").chmod(0)
    try:
        _refused(tmp_path / "shard", errno.EACCES)
    finally:
        (tmp_path / "shard").chmod(0o700)
    with NvmeShard(tmp_path / "shard") as shard:  # nothing was changed
        assert shard.get(b"k") == b"v"


def test_a_locked_shard_is_still_shard_locked(tmp_path: Path) -> None:
    with NvmeShard(tmp_path / "shard"), pytest.raises(ShardLocked):
        NvmeShard(tmp_path / "shard")
