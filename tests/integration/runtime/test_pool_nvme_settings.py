"""The service's pool settings reach each pool's NVMe shard: ``pool.fsync`` (every record
synced, else at segment close) and ``pool.nvme_reserve_tombstones`` (the space reserve a
full disk deletes from), and the pool's stats report the reserve it holds."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv_cluster.config import load_config
from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime import wiring
from agentkv_cluster.runtime.directory_glue import DirectoryShell
from agentkv_cluster.runtime.pool_actor import PoolActor
from agentkv_cluster.runtime.records import PageMeta
from agentkv_cluster.runtime.tenants import ensure_tenant
from store.nvme import FsyncPolicy
from store.types import Codec, Tier
from tests.support.pool_pages import MIB, PAGE, front_mover

pytestmark = pytest.mark.integration
TOMBSTONE_RESERVE = 2 * 4096  # one worst-case tombstone: two aligned blocks


@pytest.mark.parametrize(("fsync", "tombstones"), [(False, 32), (True, 4), (True, 0)])
def test_a_pool_shard_takes_the_service_settings(tmp_path, fsync, tombstones) -> None:
    cfg = load_config(env={}, overrides={
        "hbm": {"page_bytes": MIB},
        "pool": {"pool_bytes": 4 * MIB, "slot_bytes": MIB, "nvme_dir": str(tmp_path / "nv"),
                 "fsync": fsync, "nvme_reserve_tombstones": tombstones},
        "security": {"tenant_keys_dir": str(tmp_path / "keys")}})
    spec = wiring.pool_spec(cfg, "node-settings", tmp_path)
    ensure_tenant(spec.keys_dir, "acme")
    pool, front = PoolActor(spec, DirectoryShell()), front_mover()
    try:
        shard = pool.nvme.config
        assert shard.reserve_tombstones == tombstones
        assert shard.fsync is (FsyncPolicy.EVERY_RECORD if fsync else FsyncPolicy.ON_CLOSE)
        assert pool.stats()["nvme_reserve_bytes"] == tombstones * TOMBSTONE_RESERVE
        assert pool.stats()["nvme_reserve_target_bytes"] == tombstones * TOMBSTONE_RESERVE
        meta = PageMeta(key=b"k" * 32, digest=b"d" * 32, tenant="acme", namespace="acme",
                        session="s", page_id=1, state_type=StateType.EVIDENCE, length=PAGE,
                        tokens=1)
        front.slot_view(0, PAGE)[:] = np.full(PAGE, 7, dtype=np.uint8)
        before = pool.nvme.stats().syncs
        pool.store_from(meta, Tier.NVME, Codec.FULL, front.slot_span(0, PAGE))
        synced = pool.nvme.stats().syncs - before
        assert synced >= 1 if fsync else synced == 0  # the record synced, or left to close
    finally:
        pool.close()
        front.close()
