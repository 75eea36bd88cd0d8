"""The service's actors in this process (``wiring.deploy_local``): real NIXL, real
/dev/shm, real AES-GCM, no Ray; plus an engine-side ``Mover`` wired to the pool."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentkv_cluster.config import load_config
from agentkv_cluster.runtime import wiring
from agentkv_cluster.runtime.mover import Mover
from agentkv_cluster.runtime.tenants import ensure_tenant


@contextmanager
def local_topology(workdir: Path, *, hbm_page: int, hbm_pages: int, pool_bytes: int,
                   front_bytes: int, front_slots: int, tenant: str = "acme"
                   ) -> Iterator[tuple[Any, Mover]]:
    """``(topology, front)``: one HBM actor of ``hbm_pages`` x ``hbm_page``, one pool of
    ``pool_bytes`` in ``hbm_page`` slots, ``tenant`` provisioned."""
    cfg = load_config(env={}, overrides={
        "hbm": {"page_bytes": hbm_page, "num_pages": hbm_pages},
        "pool": {"pool_bytes": pool_bytes, "slot_bytes": hbm_page,
                 "nvme_dir": str(workdir / "nv")},
        "security": {"tenant_keys_dir": str(workdir / "keys")}})
    topo = wiring.deploy_local(cfg, workdir)
    ensure_tenant(str(workdir / "keys"), tenant)
    front = Mover(f"test-front-{id(topo):x}", front_bytes, front_slots)
    wiring.introduce(topo.pools["node0"], front)
    try:
        yield topo, front
    finally:
        wiring.shutdown(topo)
        front.close()
