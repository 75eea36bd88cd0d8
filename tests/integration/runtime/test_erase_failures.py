"""An erasure that cannot reach a tier still destroys the keys, purges every other tier,
and signs a receipt that names the failed tiers (fault injection: an unreachable pool)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.handles import ActorGone, PoolHandle
from agentkv_cluster.runtime.service import Service
from security.erasure import verify_receipt
from security.signing import load_verifier
from tests.integration.runtime.test_cluster import identity, kv_page

pytestmark = pytest.mark.integration

PAGE = 2 * 2 * 2 * 128 * 64 * 2


class _Unreachable:
    """A pool whose node is gone: every call fails as a dead Ray actor's would."""

    def purge_tenant(self, tenant: str, generation: int | None = None) -> dict:
        raise ActorGone("pool-gone: RayActorError")


def test_an_unreachable_pool_is_a_failed_tier_and_the_rest_is_purged() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-erase-fail-"))
    cfg = load_config(env={}, overrides={
        "api": {"port": 0},
        "hbm": {"page_bytes": PAGE, "num_pages": 8},
        "pool": {"pool_bytes": 4 * PAGE, "slot_bytes": PAGE, "nvme_dir": str(workdir / "nv")},
    })
    svc = Service(cfg, workdir=workdir, hbm_capacity=3 * PAGE).start(local=True)
    try:
        with svc.client("acme") as client:
            client.open_session("f1").store_pages(
                [kv_page(i, "evidence", identity("acme", "f1", 1000 * i)) for i in range(6)])
        svc.topo.pools["gone"] = PoolHandle.local(_Unreachable(), "gone")
        receipt = svc.erase_tenant("acme")
        counts = dict(receipt.counts)
        assert set(receipt.failed_tiers) == {"host", "host-scrub", "nvme", "nvme-scrub"}
        assert counts["host"] == -1 and counts["controller"] == 6 and counts["hbm"] > 0
        assert counts["directory"] > 0  # the reachable pool's copies were deleted anyway
        assert svc.topo.pools["node0"].target.stats()["copies"] == 0
        assert verify_receipt(receipt.to_json(), load_verifier(workdir / "audit.pub"))
    finally:
        svc.topo.pools.pop("gone", None)
        svc.stop()
        shutil.rmtree(workdir, ignore_errors=True)
