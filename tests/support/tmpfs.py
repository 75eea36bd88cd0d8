"""A real small file system for full-disk tests: a tmpfs mounted for the test (root only;
the test is skipped with the reason elsewhere), and ways to fill it to the last block and
to leave it no free inode."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(where: Path, nbytes: int) -> Iterator[Path]:
    """A tmpfs of ``nbytes`` at ``where`` (skips the test where this process cannot mount)."""
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={nbytes}", "tmpfs",
                            str(where)], capture_output=True, text=True, check=False)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)  # lazy: never left behind


def fill(folder: Path, name: str = "ballast") -> None:
    """Write a file into ``folder`` until its file system has no block left."""
    with open(folder / name, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\1" * 4096)
    with pytest.raises(OSError) as full, open(folder / name, "ab", buffering=0) as f:
        f.write(b"\1")
    assert full.value.errno == errno.ENOSPC


def limit_inodes(fs: Path, extra: int = 0) -> None:
    """Let the tmpfs at ``fs`` hold only the inodes it uses now, plus ``extra`` (a remount)."""
    used = os.statvfs(fs).f_files - os.statvfs(fs).f_ffree
    remount = subprocess.run(["mount", "-o", f"remount,nr_inodes={used + extra}", str(fs)],
                             capture_output=True, text=True, check=False)
    if remount.returncode != 0:
        pytest.skip(f"cannot limit a tmpfs's inodes here: {remount.stderr.strip()}")
