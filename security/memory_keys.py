"""An in-memory ``KeySource``: keys that live and die with the process.

For library use and tests (a ``store.kv.KVStore`` sealing pages without a key directory);
a service keeps its keys in files, a Kubernetes Secret or a KMS instead. Destroying a key
overwrites its bytes before it is dropped.
"""

from __future__ import annotations

import threading

from security.errors import KeyExists, KeyUnavailable
from security.keyring import TenantKeyring


class MemoryKeySource:
    """Keys in a dict, guarded by a lock; the ``KeySource`` protocol of ``security.keyring``."""

    def __init__(self) -> None:
        self._keys: dict[str, bytearray] = {}
        self._lock = threading.Lock()

    def read(self, name: str) -> bytes:
        with self._lock:
            key = self._keys.get(name)
        if key is None:
            raise KeyUnavailable(f"key {name} does not exist")
        return bytes(key)

    def create(self, name: str, material: bytes) -> None:
        with self._lock:
            if name in self._keys:
                raise KeyExists(f"key {name} already exists")
            self._keys[name] = bytearray(material)

    def destroy(self, name: str) -> bool:
        with self._lock:
            key = self._keys.pop(name, None)
        if key is None:
            return False
        key[:] = bytes(len(key))
        return True

    def require_writable(self) -> None:
        """Always writable (``KeySource``)."""

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._keys)


def memory_keyring(*tenants: str) -> TenantKeyring:
    """A keyring over a fresh ``MemoryKeySource`` with ``tenants`` created."""
    ring = TenantKeyring(MemoryKeySource())
    for tenant in tenants:
        ring.create_tenant(tenant)
    return ring


__all__ = ["MemoryKeySource", "memory_keyring"]
