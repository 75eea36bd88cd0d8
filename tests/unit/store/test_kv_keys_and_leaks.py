"""Two rough edges of the library store: a bad key is the store's own ``BadKey`` (a
``KVError``, ``ValueError`` and ``TypeError``) on every tier, not the NVMe shard's
``InvalidRecord``; and a store dropped without ``close()`` no longer leaves its pool
segment in /dev/shm (tmpfs pages that outlived the process)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from store.host_pool import SHM_DIR
from store.kv import BadKey, KVError, KVStore, KVStoreConfig

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("nvme", [False, True])
@pytest.mark.parametrize("key", ["text", 5, None, bytearray(b"k"), b"", b"x" * 256])
def test_a_bad_key_is_a_kv_error_on_every_tier(tmp_path, nvme, key):
    config = KVStoreConfig(name=f"akv-kv-keys-{uuid.uuid4().hex[:10]}", slot_bytes=4096,
                           host_slots=1, nvme_dir=str(tmp_path / "nv") if nvme else None)
    with KVStore(config) as store:
        for call in (lambda: store.put(key, b"v"), lambda: store.get(key),
                     lambda: store.contains(key), lambda: store.delete(key),
                     lambda: store.reserve(key, 1), lambda: store.drop_cache(key)):
            with pytest.raises(BadKey) as refused:
                call()
            assert isinstance(refused.value, KVError | ValueError)
            assert isinstance(refused.value, TypeError)


def test_a_store_dropped_unclosed_removes_its_pool_segment():
    name = f"akv-kv-leak-{uuid.uuid4().hex[:10]}"
    store = KVStore(KVStoreConfig(name=name, slot_bytes=4096, host_slots=2))
    store.put(b"k", b"v")
    assert (Path(SHM_DIR) / name).exists()
    del store
    gc.collect()
    assert not (Path(SHM_DIR) / name).exists()


def test_a_process_that_exits_without_close_leaves_no_pool_segment():
    name = f"akv-kv-leak-{uuid.uuid4().hex[:10]}"
    code = (f"from store.kv import KVStore, KVStoreConfig\n"
            f"s = KVStore(KVStoreConfig(name={name!r}, slot_bytes=1 << 20, host_slots=4))\n"
            f"s.put(b'k', b'v')\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert not (Path(SHM_DIR) / name).exists()
