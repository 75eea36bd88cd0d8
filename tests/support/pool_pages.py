"""A pool actor in this process over a real redis-server, for the directory repair tests:
its spec, a page stored into it through a front ``Mover``, and a bounded wait."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from agentkv_cluster.config import load_config
from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime import wiring
from agentkv_cluster.runtime.mover import Mover
from agentkv_cluster.runtime.pool_actor import PoolActor, PoolSpec
from agentkv_cluster.runtime.records import PageMeta
from agentkv_cluster.runtime.tenants import ensure_tenant
from store.types import Codec, Tier

MIB = 1 << 20
PAGE = 64 * 1024


def pool_spec(tmp_path: Path, tenants: tuple[str, ...] = ("acme",)) -> PoolSpec:
    """A 4 MiB host pool of 1 MiB slots over an NVMe shard in ``tmp_path``, with keys for
    ``tenants``."""
    cfg = load_config(env={}, overrides={
        "hbm": {"page_bytes": MIB},  # a slot holds a full page
        "pool": {"pool_bytes": 4 * MIB, "slot_bytes": MIB, "nvme_dir": str(tmp_path / "nv")},
        "security": {"tenant_keys_dir": str(tmp_path / "keys")}})
    spec = wiring.pool_spec(cfg, f"node-{uuid.uuid4().hex[:6]}", tmp_path)
    for tenant in tenants:
        ensure_tenant(spec.keys_dir, tenant)
    return spec


def front_mover() -> Mover:
    return Mover(f"test-front-{uuid.uuid4().hex[:6]}", PAGE, 1)


def store_page(pool: PoolActor, front: Mover, i: int, tenant: str = "acme") -> bytes:
    """Page ``i`` of ``tenant`` (PAGE bytes of value i) stored on the host tier; its key."""
    key = bytes([i]) * 32
    meta = PageMeta(key=key, digest=b"d" * 32, tenant=tenant, namespace=tenant, session="s",
                    page_id=i, state_type=StateType.EVIDENCE, length=PAGE, tokens=1)
    front.slot_view(0, PAGE)[:] = np.full(PAGE, i, dtype=np.uint8)
    pool.store_from(meta, Tier.HOST, Codec.FULL, front.slot_span(0, PAGE))
    return key


def wait_until(cond: Callable[[], object], timeout_s: float = 30.0, every_s: float = 0.1
               ) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every_s)
