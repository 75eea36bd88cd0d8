"""An erasure made with ``agentkv tenant erase`` while the service runs: once the service
enforces it, ``/metrics`` no longer names the tenant (docs/metrics.md: an erased
tenant's series are removed), as after an erasure the service ran itself, and the
controller's per-tenant counts no longer name it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agentkv_cluster.api.metrics import blinded_tenant
from agentkv_cluster.cli import main
from agentkv_cluster.runtime.records import RETIRED_TENANT
from agentkv_cluster.runtime.service import Service
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.integration.runtime.test_metrics import PAGE
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


def _enforced(log: Path) -> list[str]:
    return [r["data"]["tenant"] for r in map(json.loads, log.read_text().splitlines())
            if r["kind"] == "erasure.enforced"]


def _labelled(service: Service, tenant: str) -> int:
    """How many series of the exposition carry ``tenant``'s label."""
    label = f'tenant="{blinded_tenant(tenant, service.token_secret)}"'
    return sum(label in line for line in service.metrics.exposition().decode().splitlines()
               if not line.startswith("#"))


def _counted(service: Service) -> set[str]:
    """The tenants the controller's per-tenant counts (sent on each scrape) name."""
    got = service.topo.controller.metrics_since(0)
    return {t for t, _ in [*got.traffic, *got.codecs]} | set(got.recompute)


def test_an_erasure_the_cli_made_removes_the_tenants_series(capsys) -> None:
    with local_service("agentkv-erase-metrics-", page_bytes=PAGE, hbm_pages=8,
                       pool_bytes=4 * PAGE, hbm_capacity=3 * PAGE) as service:
        for tenant in ("acme", "globex"):
            with service.client(tenant) as client, client.open_session("m1") as s:
                keys = s.store_pages([kv_page(i, "evidence", identity(tenant, "m1", 1000 * i))
                                      for i in range(4)])
                s.load(keys[:2])
        assert _labelled(service, "acme") and _labelled(service, "globex")
        deadline = time.monotonic() + 20
        while _counted(service) != {"acme", "globex"}:  # pushed out to the pool: counted
            assert time.monotonic() < deadline, _counted(service)
            time.sleep(0.1)
        log = service.workdir / "audit.log"
        assert main(["tenant", "erase", "acme", "--keys-dir", service.keys_dir, "--audit-log",
                     str(log), "--signing-key", str(service.workdir / "audit.key")]) == 0
        capsys.readouterr()  # the receipt
        deadline = time.monotonic() + 20
        while "acme" not in _enforced(log):
            assert time.monotonic() < deadline, "the service did not enforce the erasure"
            time.sleep(0.1)
        assert _labelled(service, "acme") == 0
        assert _labelled(service, "globex")  # only the erased tenant's series go
        assert _counted(service) == {"globex", RETIRED_TENANT}  # nor the controller's counts
