"""File-system helpers of NVMe shards: buffers, free space, directory lock and sync."""

from __future__ import annotations

import fcntl
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from store import nvme_format as fmt
from store.nvme_types import InvalidRecord, ShardLocked


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


def aligned_buffer(n: int) -> np.ndarray:
    """A page-aligned, pre-faulted buffer (anonymous mmap): reads into it run at full speed."""
    buf = np.frombuffer(mmap.mmap(-1, n), dtype=np.uint8)
    buf[:] = 0
    return buf


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_directory(path: Path) -> int:
    fd = os.open(path / "LOCK", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ShardLocked(f"{path} is open in another process") from None
    return fd
