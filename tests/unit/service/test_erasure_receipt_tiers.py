"""What ``ClusterErasure.erase`` signs when the controller's part did not finish: a
transfer of the tenant's pages still running when the controller gave up waiting (it may
yet land a copy somewhere) fails the controller's tiers on the receipt, as an unreachable
controller does, while the keys go and every other tier is still purged. Real key
directory, audit log and signer; the controller, pools and directory are stand-ins that
answer as the actors do (the purge itself: tests/integration/runtime/test_erase*.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agentkv_cluster.runtime.erasure import ClusterErasure
from agentkv_cluster.runtime.erasure_receipts import ControllerErased, PoolPurged, TenantForgotten
from agentkv_cluster.runtime.handles import ActorGone
from security.audit import AuditLog
from security.erasure import verify_receipt
from security.keyring import FileKeySource, TenantKeyring
from security.signing import Signer, Verifier

CONTROLLER_TIERS = {"controller", "sessions", "pins", "hbm", "hbm-scrub"}


class _Controller:
    """Answers ``erase_tenant`` with ``straggling`` transfers left (or is gone)."""

    def __init__(self, straggling: int = 0, gone: bool = False) -> None:
        self.straggling, self.gone = straggling, gone
        self.frozen: list[str] = []

    def options(self, timeout_s: float) -> _Controller:
        return self

    def freeze_tenant(self, tenant: str) -> None:
        self.frozen.append(tenant)

    def thaw_tenant(self, tenant: str) -> None:
        self.frozen.remove(tenant)

    def erase_tenant(self, tenant: str) -> ControllerErased:
        if self.gone:
            raise ActorGone("controller: RayActorError")
        forgotten = TenantForgotten(keys={}, pages=3, resident=2, sessions=1, pins=1,
                                    cancelled=0, straggling=self.straggling)
        return ControllerErased(forgotten=forgotten, hbm_pages=2, hbm_free_zeroed=5,
                                hbm_actors=1)


class _Pool:
    def __init__(self) -> None:
        self.purged: list[str] = []

    def options(self, timeout_s: float) -> _Pool:
        return self

    def purge_tenant(self, tenant: str, generation: int | None = None) -> PoolPurged:
        self.purged.append(tenant)
        return PoolPurged(copies=((b"k" * 32, 0),), host=1, nvme=0, host_free_zeroed=4,
                          nvme_dead_zeroed=0, staging_zeroed=0)


class _Directory:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    def delete_namespace(self, namespace: str) -> int:
        self.deleted.append(namespace)
        return 1


def _erase(tmp_path, controller: _Controller):
    keys = tmp_path / "keys"
    ring = TenantKeyring(FileKeySource(keys))
    ring.create_tenant("acme")
    signer = Signer.generate()
    audit = AuditLog(tmp_path / "audit.log", signer)
    pool, directory = _Pool(), _Directory()
    topo = SimpleNamespace(controller=controller, pools={"node0": pool}, directory=directory)
    try:
        receipt = ClusterErasure(topo, None, str(keys), audit, signer).erase("acme")
    finally:
        audit.close()
    assert verify_receipt(receipt.to_json(), Verifier(signer.public_raw())) == receipt
    assert not ring.has_keys("acme") and controller.frozen == []
    assert pool.purged == ["acme"] and len(directory.deleted) == 1  # the rest went anyway
    return receipt, dict(receipt.counts)


def test_a_finished_controller_part_counts_what_it_dropped(tmp_path) -> None:
    receipt, counts = _erase(tmp_path, _Controller())
    assert receipt.failed_tiers == ()
    assert [counts[t] for t in ("controller", "sessions", "pins", "hbm", "hbm-scrub")] == \
        [3, 1, 1, 2, 5]
    assert counts["host"] == 1 and counts["directory"] == 1


@pytest.mark.parametrize("controller", [_Controller(straggling=1), _Controller(gone=True)],
                         ids=["straggling", "gone"])
def test_an_unfinished_controller_part_fails_its_tiers(tmp_path, controller) -> None:
    receipt, counts = _erase(tmp_path, controller)
    assert set(receipt.failed_tiers) == CONTROLLER_TIERS
    assert all(counts[t] == -1 for t in CONTROLLER_TIERS)
    assert counts["host"] == 1 and counts["directory"] == 1
