"""A named shared-memory segment in /dev/shm, shared by processes.

``ShmSegment.create`` makes a new segment of a fixed size, allocates it on tmpfs at once
(``posix_fallocate``: a full /dev/shm fails here, not in the middle of a write) and maps
it pre-faulted (``MAP_POPULATE``); ``attach`` maps an existing one. The writer role is an
exclusive ``flock`` on the segment, which the kernel drops if the writer dies, so a new
writer can take over. Segments are opened with ``os.open`` + ``mmap``, never
``multiprocessing.shared_memory`` (a reader that exits would unlink the segment).
What lives inside the bytes is the caller's business (``store.host_pool``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
from collections.abc import Callable

from store import forks

SHM_DIR = "/dev/shm"


class SegmentBusy(OSError):
    """Another live process holds the writer role."""


class SegmentNoSpace(OSError):
    """/dev/shm cannot hold a segment of that size."""


class SegmentTooSmall(ValueError):
    """The segment is smaller than its format's header."""


def segment_path(name: str) -> str:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"segment name must be a plain file name, got {name!r}")
    return os.path.join(SHM_DIR, name)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a writer that died mid-write leaves its pid behind)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ShmSegment:
    """One mapping of a segment; ``writer`` when this handle holds the writer lock."""

    def __init__(self, name: str, fd: int, mm: mmap.mmap, writer: bool) -> None:
        self.name, self.fd, self.mm, self.writer = name, fd, mm, writer
        self._file = _identity(os.fstat(fd))  # ``unlink`` removes this file, never a newer one
        self._opened = forks.generation()

    @classmethod
    def create(cls, name: str, size: int, init: Callable[[mmap.mmap], None]) -> ShmSegment:
        """A new segment of ``size`` bytes, formatted by ``init`` before anyone can use it;
        this handle is its writer. ``FileExistsError`` if the name is taken,
        ``SegmentNoSpace`` if /dev/shm cannot hold it; nothing is left behind on failure."""
        path = segment_path(name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                os.posix_fallocate(fd, 0, size)  # tmpfs allocates now: ENOSPC here, not later
            except OSError as exc:
                raise SegmentNoSpace(exc.errno, f"{name}: {size} B: {exc.strerror}") from exc
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
            init(mm)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        return cls(name, fd, mm, writer=True)

    @classmethod
    def attach(cls, name: str, *, writer: bool = False, min_size: int = 0) -> ShmSegment:
        """Map an existing segment. ``writer=True`` takes the writer lock (``SegmentBusy``
        while another live process holds it); ``SegmentTooSmall`` for a segment under
        ``min_size`` bytes."""
        fd = os.open(segment_path(name), os.O_RDWR)
        try:
            if writer:
                _take_writer_lock(fd, name)
            size = os.fstat(fd).st_size
            if size < max(min_size, 1):
                raise SegmentTooSmall(f"{name}: segment of {size} bytes is too small")
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
            return cls(name, fd, mm, writer)
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        """Unmap and drop the writer lock; the segment stays for other processes."""
        try:
            self.mm.close()
        except BufferError:
            pass  # a caller still holds a view (e.g. a transport registration): unmapped on GC
        # mmap holds a dup of the fd, so closing ours alone may keep the lock. A fork child
        # shares the lock with its parent (one open file): unlocking would drop the parent's.
        if self.writer and not forks.forked_since(self._opened):
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)

    def unlink(self) -> None:
        """Remove the segment name (mappings stay valid until each process closes), if it
        still names this segment: once removed, the name may be a new segment's (a store
        that reopened under it), which a late second ``unlink`` must leave alone."""
        _unlink_if(segment_path(self.name), self._file)


def _take_writer_lock(fd: int, name: str) -> None:
    """The segment's writer lock, or ``SegmentBusy`` while another live process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        raise SegmentBusy(f"{name}: another process is the writer") from exc


def remove_abandoned(name: str, magic: bytes) -> None:
    """Unlink segment ``name`` if its writer is gone (no process holds the writer lock) and
    it starts with ``magic``: what a writer that crashed leaves behind. ``SegmentBusy`` while
    a live writer holds it, ``FileExistsError`` for a file of another kind."""
    path = segment_path(name)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        _take_writer_lock(fd, name)
        if os.pread(fd, len(magic), 0) != magic:
            raise FileExistsError(errno.EEXIST, f"{path} exists and is not such a segment")
        _unlink_if(path, _identity(os.fstat(fd)))  # not a new one
    finally:
        os.close(fd)


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _unlink_if(path: str, file: tuple[int, int]) -> None:
    """Unlink ``path`` if it still names ``file`` (device, inode), not a file made since."""
    with contextlib.suppress(FileNotFoundError):
        if _identity(os.stat(path)) == file:
            os.unlink(path)
