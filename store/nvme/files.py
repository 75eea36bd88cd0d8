"""File-system helpers of NVMe shards: keys and views, free space, directory lock and sync,
page-cache control."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
from pathlib import Path
from typing import Any

from store.nvme import format as fmt
from store.nvme.types import FullResource, InvalidRecord, ShardLocked, ShardUnavailable


def check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or not 0 < len(key) <= fmt.MAX_KEY_BYTES:
        raise InvalidRecord(f"key must be 1..{fmt.MAX_KEY_BYTES} bytes, got {key!r:.60}")


def as_bytes_view(data: Any) -> memoryview:
    try:
        view = memoryview(data)
    except TypeError as exc:
        raise InvalidRecord(f"payload must support the buffer protocol: {exc}") from exc
    if not view.c_contiguous:
        raise InvalidRecord("payload must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def writable_view(out: Any, n: int) -> memoryview:
    """``out`` as a flat, writable byte view of at least ``n`` bytes."""
    try:
        view = memoryview(out)
    except TypeError as exc:
        raise InvalidRecord(f"out must support the buffer protocol: {exc}") from exc
    if view.readonly or not view.c_contiguous:
        raise InvalidRecord("out must be a writable, C-contiguous buffer")
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    if view.nbytes < n:
        raise InvalidRecord(f"out holds {view.nbytes} bytes; the record has {n}")
    return view


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def free_inodes(path: Path) -> int | None:
    """Inodes the file system of ``path`` has free for this user; None where it reports no
    inode limit (``f_files`` 0: btrfs and others allocate inodes as they go)."""
    st = os.statvfs(path)
    return st.f_favail if st.f_files else None


def full_resource(err: int, inodes: int | None) -> FullResource:
    """What a file system that refused a new file with ``err`` (ENOSPC, EDQUOT) ran out of,
    given the free inodes it reports now (``free_inodes``)."""
    if err == errno.EDQUOT:
        return FullResource.QUOTA
    return FullResource.INODES if inodes == 0 else FullResource.SPACE


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_range(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to drop ``[offset, offset + length)`` of ``fd`` from the page cache.

    Clean pages go at once; dirty ones only start writeback, so sync first for a full drop.
    The range is widened to whole pages: the kernel drops only pages wholly inside it, so
    a record ending mid-page would keep its last page cached.
    """
    page = mmap.PAGESIZE
    start = offset - offset % page
    end = -(-(offset + length) // page) * page
    os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


def resident_pages(fd: int, offset: int, length: int) -> tuple[int, int]:
    """(pages of ``[offset, offset + length)`` in the page cache, pages in that range), by
    ``mincore(2)`` on a read-only mapping that touches nothing."""
    if length <= 0:
        return 0, 0
    page = mmap.PAGESIZE
    start = offset - offset % page
    span = offset + length - start
    pages = -(-span // page)
    addr = _libc.mmap(None, span, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
    if addr in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"mmap for mincore: {os.strerror(err)}")
    try:
        vec = ctypes.create_string_buffer(pages)
        if _libc.mincore(addr, span, vec) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mincore: {os.strerror(err)}")
        return sum(b & 1 for b in vec.raw), pages
    finally:
        _libc.munmap(addr, span)


def lock_directory(path: Path) -> int:
    fd = os.open(path / "LOCK", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ShardLocked(f"{path} is open in another process") from None
    return fd


def unavailable(path: Path, exc: OSError) -> ShardUnavailable:
    """``exc`` (raised while opening the shard at ``path``) as the shard's own error."""
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
    return ShardUnavailable(exc.errno, f"cannot open NVMe shard {path}{where}: "
                                       f"{exc.strerror or exc}")
