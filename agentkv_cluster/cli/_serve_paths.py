"""What ``agentkv serve`` claims on this machine before Ray starts.

One service per state directory, and (with a local Ray, whose pools all run here) one per
NVMe directory: a second ``agentkv serve`` on either would share the audit log, the NVMe
shards and the host pool's shared-memory segment (named after the shard's folder), and
used to fail only once Ray was up, with a pool actor that died for no stated reason. Each
directory gets an exclusive ``flock`` on ``DIR/serve.lock``, held for the life of the
process; the kernel drops it when the process dies, ``kill -9`` included, so no stale
lock is left behind and a restart after a crash needs no cleanup. The file holds the pid
of its holder, which the refusal names.

The NVMe directory is created and checked here too, so a path that is a file, cannot be
created or is not writable is a one-line error naming ``--nvme-dir``; and a quota the file
system cannot hold is said at start (``nvme_space_warning``), not found out when
demotions start to fail.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path
from typing import Any

from agentkv_cluster.cli import CliError
from agentkv_cluster.config import nvme_root

LOCK_NAME = "serve.lock"
SEGMENT_GLOB = "*/seg-*.akv"  # the shard files of every pool under the NVMe directory


class DirectoryInUse(CliError):
    """Another live ``agentkv serve`` holds this directory."""

    def __init__(self, flag: str, path: Path, holder: str) -> None:
        who = f"pid {holder}" if holder else "pid unknown"
        super().__init__(f"{flag} {path} is in use by another agentkv serve ({who}); "
                         f"stop it first or pass another {flag}")
        self.flag, self.path, self.holder = flag, path, holder


class ServeClaim:
    """The locks one ``agentkv serve`` holds; ``release`` drops them (exit does too)."""

    def __init__(self) -> None:
        self._fds: list[int] = []

    def lock(self, flag: str, directory: Path) -> None:
        """Take ``directory/serve.lock``, or raise ``DirectoryInUse`` (nothing else held
        by this claim is dropped: the caller releases it). On a file system that has no
        ``flock`` the directory is not locked."""
        path = directory / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise CliError(f"{flag} {directory}: cannot create {LOCK_NAME}: "
                           f"{exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            raise DirectoryInUse(flag, directory, holder) from None
        except OSError:  # a file system without flock (some network or FUSE mounts):
            os.close(fd)  # the service runs as before, without this guard
            return
        self._fds.append(fd)
        with contextlib.suppress(OSError):  # the pid only names the holder in a refusal
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)  # drops the flock; the file stays (a later serve reuses it)


def prepare_nvme(root: Path) -> None:
    """Create ``root`` if missing and check that it is a writable directory."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CliError(f"--nvme-dir {root} is a file, not a directory") from None
    except OSError as exc:
        raise CliError(f"--nvme-dir {root}: {exc.strerror}") from None
    if not root.is_dir():
        raise CliError(f"--nvme-dir {root} is not a directory")
    if not os.access(root, os.W_OK | os.X_OK):
        raise CliError(f"--nvme-dir {root} is not writable")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def nvme_space_warning(quota: int, free: int, held: int) -> str | None:
    """What to tell the operator when a shard's quota (``--nvme-bytes``) exceeds what its
    file system can hold: the bytes free there plus those the shard files already hold.
    None when it fits."""
    room = free + held
    if quota <= room:
        return None
    return (f"--nvme-bytes {_size(quota)} does not fit: the file system has {_size(free)} "
            f"free and the shards hold {_size(held)}, so the NVMe tier fills at about "
            f"{_size(room)} and pages that would move there stay in HBM or the host pool")


def held_bytes(root: Path) -> int:
    """Bytes in the shard files under ``root`` (every pool's folder)."""
    total = 0
    for path in root.glob(SEGMENT_GLOB):
        try:
            total += path.stat().st_size
        except OSError:  # removed by a compaction meanwhile
            continue
    return total


def claim_local_paths(cfg: Any, state: Path) -> tuple[ServeClaim, str | None]:
    """Lock the state directory and, with a local Ray, the NVMe directory (created and
    checked first); returns the claim and a warning about the NVMe quota, if any. With
    ``--address`` the pools run on other nodes: their NVMe folders are theirs to check."""
    claim = ServeClaim()
    try:
        claim.lock("--state-dir", state)
        if cfg.ray.address:
            return claim, None
        root = nvme_root(cfg, state)  # the pools' own rule (``wiring.pool_spec``)
        prepare_nvme(root)
        if root.resolve() != state.resolve():  # one lock per file: a second would block
            claim.lock("--nvme-dir", root)
        warning = nvme_space_warning(cfg.pool.nvme_bytes, shutil.disk_usage(root).free,
                                     held_bytes(root))
    except BaseException:
        claim.release()
        raise
    return claim, warning
