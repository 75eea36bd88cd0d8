"""A fork child inherits its parent's store handles (their flocks included) but may not use
them: it would take the parent's next host slot and NVMe offset. Every tier refuses with a
typed error, and the child's ``close`` leaves the parent's locks and files alone. Each case
runs in a fresh interpreter, so pytest's own threads are never forked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

from store.host_pool import SHM_DIR

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent("""
    import json, os, sys
    from store.host_pool import HostPool, PoolBusy
    from store.kv import KVStore, KVStoreConfig
    from store.types import Tier

    name, nvme_dir = sys.argv[1], sys.argv[2]
    store = KVStore(KVStoreConfig(name=name, slot_bytes=8192, host_slots=4, nvme_dir=nvme_dir))
    store.put(b"a", b"A" * 10)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        seen = {}
        for call, fn in [
            ("put", lambda: store.put(b"child", b"CHILD VALUE")),
            ("put_nvme", lambda: store.put(b"child-nvme", b"CHILD", Tier.NVME)),
            ("get", lambda: store.get(b"a")),
            ("reserve", lambda: store.reserve(b"r", 4)),
            ("pool_alloc", lambda: store.host.alloc()),
            ("shard_put", lambda: store.nvme.put(b"x", b"y", 0)),
            ("shard_get", lambda: store.nvme.get(b"a")),
        ]:
            try:
                fn()
                seen[call] = "ok"
            except Exception as exc:
                seen[call] = type(exc).__name__
        store.close()  # marks the child's copy closed; the parent's locks stay
        os.write(w, json.dumps(seen).encode())
        sys.exit(0)  # a normal exit: finalizers run in the child too
    os.close(w)
    seen = json.loads(os.read(r, 1 << 16))
    os.waitpid(pid, 0)
    store.put(b"parent", b"PARENT VALUE")
    store.put(b"parent-nvme", b"PARENT NVME", Tier.NVME)
    try:
        HostPool.attach(name, writer=True)
        seen["parent_lock"] = "lost"
    except PoolBusy:
        seen["parent_lock"] = "held"
    seen["segment"] = os.path.exists("/dev/shm/" + name)
    seen["values"] = [bytes(store.get(k)).decode() for k in (b"a", b"parent", b"parent-nvme")]
    seen["keys"] = sorted(k.decode() for k in store.nvme.keys())
    store.close()
    print(json.dumps(seen))
""")


def test_a_fork_child_cannot_use_its_parents_store_and_its_close_leaves_it_alone(tmp_path):
    name = f"akv-kv-fork-{uuid.uuid4().hex[:10]}"
    done = subprocess.run([sys.executable, "-c", SCRIPT, name, str(tmp_path / "nv")], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    for call in ("put", "put_nvme", "get", "reserve"):
        assert seen[call] == "StoreForked", (call, seen)
    assert seen["pool_alloc"] == "PoolForked" and seen["shard_put"] == "ShardForked"
    assert seen["shard_get"] == "ShardForked"
    assert seen["parent_lock"] == "held" and seen["segment"] is True
    assert seen["values"] == ["AAAAAAAAAA", "PARENT VALUE", "PARENT NVME"]
    assert seen["keys"] == ["parent-nvme"]
    assert not (Path(SHM_DIR) / name).exists()  # the parent's close removed it
