"""What a key directory says of tenant erasures, cached for readers on every request.

Each erasure leaves a mark in the tenant's key directory (``TenantKeyring.erasures``).
Reading the marks lists the directory, so ``ErasureMarks`` re-reads them only when the
directory changed (a mark is a file there: the directory's mtime moves) and at least
every ``recheck_s`` (a coarse clock may hide a change). Thread-safe. The service's front
checks tokens against them (``runtime.front.ErasureGate``), and so does a vLLM engine's
embedded store, which also drops an erased tenant's blocks (``engines/vllm``).
"""

from __future__ import annotations

import math
import os
import threading
import time

from security.errors import KeyUnavailable
from security.keyring import TenantKeyring


class ErasureMarks:
    def __init__(self, keyring: TenantKeyring, keys_dir: str, recheck_s: float = 1.0) -> None:
        self.keyring, self.keys_dir, self.recheck_s = keyring, keys_dir, recheck_s
        self._lock = threading.Lock()
        self._read: tuple[dict[str, float], float, int] | None = None  # (marks, when, stamp)

    def all(self) -> dict[str, float]:
        """Every erased tenant, with when it was last erased (seconds since the epoch);
        none where there is no key directory (nothing was ever erased there). A directory
        that cannot be read now (an I/O error, gone, a path turned into a file) fails
        closed: the marks last read stand until a read succeeds (an erasure is never taken
        back), and with none read yet, where the directory is there, ``KeyUnavailable``."""
        now, stamp = time.monotonic(), _mtime_ns(self.keys_dir)
        with self._lock:
            read = self._read
        if read is not None and read[2] == stamp and now - read[1] < self.recheck_s:
            return read[0]
        try:
            marks = self.keyring.erasures()
        except (OSError, KeyUnavailable) as exc:
            if read is not None:
                return read[0]  # not cached as fresh: the next call reads again
            if not isinstance(exc, FileNotFoundError):
                raise KeyUnavailable(f"erasure marks in {self.keys_dir} cannot be read: "
                                     f"{exc}") from None
            marks = {}  # no key directory (yet): nothing was ever erased there
        with self._lock:
            self._read = (marks, now, stamp)
        return marks

    def erased_at(self, tenant: str) -> float | None:
        """When ``tenant`` was last erased, or None if it never was."""
        return self.all().get(tenant)

    def invalidate(self) -> None:
        """Read the marks again at the next call (an erasure here just wrote one)."""
        with self._lock:
            if self._read is not None:  # stale, but kept for a read that fails (``all``)
                self._read = (self._read[0], -math.inf, self._read[2])


def _mtime_ns(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1
