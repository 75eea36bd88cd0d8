"""A running service's erasure on a disk that fills midway: the keys go, the audit log
refuses the erasure's last record, and the same erasure asked again finishes it with a
signed receipt (a real tmpfs holds the service's work folder, audit log and keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.erasure_receipts import PoolPurged
from agentkv_cluster.runtime.handles import PoolHandle
from agentkv_cluster.runtime.service import Service
from security.audit import verify_log
from security.audit_format import read_records
from security.erasure import unfinished_erasures, verify_receipt
from security.errors import ErasureUnrecorded, KeyUnavailable
from security.signing import load_verifier
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.tmpfs import fill, tmpfs

pytestmark = pytest.mark.integration

PAGE = 2 * 2 * 2 * 128 * 64 * 2


def _service_on(disk: Path) -> Service:
    """A local service whose work folder (keys, audit log) and NVMe tier are on ``disk``."""
    cfg = load_config(env={}, overrides={
        "api": {"port": 0}, "hbm": {"page_bytes": PAGE, "num_pages": 8},
        "pool": {"pool_bytes": 4 * PAGE, "slot_bytes": PAGE, "nvme_dir": str(disk / "nv"),
                 "nvme_reserve_tombstones": 0}})
    return Service(cfg, workdir=disk / "work", hbm_capacity=3 * PAGE).start(local=True)


class _FillsTheDisk:
    """A second pool that holds nothing of the tenant; its purge runs while something
    else on the node writes the disk full (the first time only)."""

    def __init__(self, disk: Path) -> None:
        self.disk, self.calls = disk, 0

    def purge_tenant(self, tenant: str, generation: int | None = None) -> PoolPurged:
        self.calls += 1
        if self.calls == 1:
            fill(self.disk)
        return PoolPurged(copies=(), host=0, nvme=0, host_free_zeroed=0, nvme_dead_zeroed=0,
                          staging_zeroed=0)


def test_an_erasure_whose_receipt_the_full_disk_refused_is_finished_when_asked_again(
        tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", 64 << 20) as disk:
        svc = _service_on(disk)
        filler = _FillsTheDisk(disk)
        try:
            with svc.client("acme") as client:
                client.open_session("s").store_pages(
                    [kv_page(i, "evidence", identity("acme", "s", 1000 * i)) for i in range(6)])
            svc.topo.pools["filler"] = PoolHandle.local(filler, "filler")
            with pytest.raises(ErasureUnrecorded, match="run the same erasure again"):
                svc.erase_tenant("acme")
            log = disk / "work" / "audit.log"
            [begun] = unfinished_erasures(log)
            assert begun.tenant == "acme"
            assert svc.topo.pools["node0"].target.stats()["copies"] == 0  # purged all the same
            (disk / "ballast").unlink()

            receipt = svc.erase_tenant("acme")  # no keys left: it finishes the one begun
            assert receipt.key_ids == begun.key_ids and receipt.failed_tiers == ()
            # what the refused attempt deleted is counted: this run found nothing left
            counts = dict(receipt.counts)
            assert counts["controller"] == 6 and counts["host"] + counts["hbm"] >= 6
            assert filler.calls == 2
            verifier = load_verifier(disk / "work" / "audit.pub")
            assert verify_receipt(receipt.to_json(), verifier) == receipt
            assert verify_log(log, verifier, anchors=[receipt.audit_position()]).ok
            assert unfinished_erasures(log) == []
            with pytest.raises(KeyUnavailable):
                svc.erase_tenant("acme")
        finally:
            svc.topo.pools.pop("filler", None)
            svc.stop()


def _ev(version: int, **fields: object) -> dict:
    return {"event_id": version, "task_id": "t", "version": version, "ts": float(version),
            **fields}


def test_retired_page_summaries_the_full_disk_refused_are_written_once_it_has_room(
        tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", 64 << 20) as disk:
        svc = _service_on(disk)
        try:
            svc.drain_audit()
            with svc.client("acme") as client, client.open_session("v") as s:
                fill(disk)
                with svc.client("globex") as other, pytest.raises(RemoteError) as refused:
                    other.open_session("w")  # a new tenant's keys: no room for them now
                assert refused.value.code == "busy" and "retry later" in str(refused.value)
                s.store_pages([kv_page(0, "task_input", identity("acme", "v", 0)),
                               kv_page(1, "temp_reasoning", identity("acme", "v", 128))])
                s.event("task_start", **_ev(1, prefix_generation=1, input_pages=[0]))
                s.event("model_call", **_ev(2, call_id="m1", consumes=[0],
                                            produces=[[1, "temp_reasoning"]]))
                s.event("verification_pass", **_ev(3, call_id="v1", pages=[1]))
            assert svc.drain_audit() == 0  # refused: kept, not lost
            (disk / "ballast").unlink()
            assert svc.drain_audit() >= 1
            log = disk / "work" / "audit.log"
            retired = [rec["data"]["type"] for _n, rec in read_records(log)
                       if isinstance(rec, dict) and rec["kind"] == "page_retired"]
            assert retired == ["verified_result"]
            assert verify_log(log, load_verifier(disk / "work" / "audit.pub")).ok
        finally:
            svc.stop()
