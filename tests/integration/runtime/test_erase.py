"""Tenant erasure through the service: keys crypto-shredded, pages gone from HBM, host
pool, NVMe and the directory, a receipt that verifies with the public key alone, and
other tenants untouched."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from agentkv_cluster.api.client import AgentKvClient
from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.service import Service
from security.audit import verify_log
from security.blinding import DirectoryBlinder
from security.erasure import verify_receipt
from security.errors import InvalidReceipt, KeyUnavailable
from security.keyring import FileKeySource, TenantKeyring
from security.signing import load_verifier
from store.types import Lookup
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.integration.runtime.test_metrics import PAGE

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def service():
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-erase-"))
    cfg = load_config(env={}, overrides={
        "api": {"port": 0},
        "hbm": {"page_bytes": PAGE, "num_pages": 12},
        "pool": {"pool_bytes": 4 << 20, "slot_bytes": PAGE, "nvme_dir": str(workdir / "nv")},
    })
    svc = Service(cfg, workdir=workdir, hbm_capacity=4 * PAGE).start(local=True)
    yield svc
    svc.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def _store(svc: Service, tenant: str, n: int):
    client = svc.client(tenant)
    s = client.open_session("e1")
    pages = [kv_page(i, "evidence", identity(tenant, "e1", 1000 * i)) for i in range(n)]
    return client, s, pages, s.store_pages(pages)


def _tiers_holding(svc: Service, keys: list[bytes]) -> dict[str, int]:
    topo = svc.topo
    held = {"hbm": 0, "host": 0, "nvme": 0}
    resident = [set(h.keys()) for h in topo.hbms.values()]  # per HBM actor
    for key in keys:
        held["hbm"] += sum(key in r for r in resident)
    for pool in topo.pools.values():
        for holding in pool.holds_many(keys):
            for tier, _codec in holding.copies if holding is not None else ():
                held[tier.name.lower()] += 1
    return held


def test_erase_shreds_keys_and_pages_in_every_tier(service) -> None:
    acme, s_acme, _pages, keys = _store(service, "acme", 6)  # 6 pages, room for 4 in HBM
    old_token = service.token("acme")  # still valid for a day when the tenant is erased
    globex, s_glob, g_pages, g_keys = _store(service, "globex", 1)
    before = _tiers_holding(service, keys)
    assert before["hbm"] > 0 and before["host"] + before["nvme"] > 0, before
    arena = service.topo.hbms["node0-hbm0"].target.arena.buffer.numpy().tobytes()
    # 64 bytes from inside each acme page (page 0 has the same bytes as globex's page 0)
    marks = [p["data"][4096:4160] for p in _pages[1:]]
    assert sum(m in arena for m in marks) == len(marks)  # the demoted ones linger, freed
    keyring = TenantKeyring(FileKeySource(service.keys_dir))
    namespace = DirectoryBlinder(keyring).namespace("acme")
    directory = service.topo.directory
    listed = [k for k in keys if directory.get(namespace, k)[0] is Lookup.HIT]
    assert listed  # pool copies are published in the directory

    receipt = service.erase_tenant("acme")

    counts = dict(receipt.counts)
    assert receipt.failed_tiers == ()
    assert counts["hbm"] == before["hbm"]
    assert counts["host"] + counts["nvme"] == before["host"] + before["nvme"]
    assert counts["directory"] == len(listed)
    assert _tiers_holding(service, keys) == {"hbm": 0, "host": 0, "nvme": 0}
    arena = service.topo.hbms["node0-hbm0"].target.arena.buffer.numpy().tobytes()
    assert not any(m in arena for m in marks)  # resident and freed pages alike are zero
    assert all(directory.get(namespace, k)[0] is Lookup.MISS for k in keys)
    assert keyring.generations("acme") == []
    with pytest.raises(KeyUnavailable):
        DirectoryBlinder(TenantKeyring(FileKeySource(service.keys_dir))).namespace("acme")
    with pytest.raises(RemoteError):  # the old session and its pages are gone
        s_acme.prepare_load(keys[:1])
    acme.close()
    # A token issued before the erasure is void: it cannot open a session, which would
    # provision the tenant's keys again, nor reach anything else.
    with AgentKvClient.connect(service.address, old_token) as stale, \
            pytest.raises(RemoteError, match="auth"):
        stale.open_session("e2")
    assert keyring.generations("acme") == []
    with service.client("acme") as fresh:  # the tenant provisioned again, new token
        fresh.open_session("e3")
    assert keyring.generations("acme") == [1]
    assert keyring.erased_at("acme") == pytest.approx(receipt.time, abs=0.001)

    public = load_verifier(service.workdir / "audit.pub")  # the public key alone
    assert verify_receipt(receipt.to_json(), public).tenant == "acme"
    forged = receipt.to_json().replace('"acme"', '"acmf"')
    with pytest.raises(InvalidReceipt):
        verify_receipt(forged, public)
    report = verify_log(service.workdir / "audit.log", public)
    assert report.ok and report.records >= 1, report.problems

    prep = s_glob.prepare_load(g_keys)  # another tenant is untouched
    assert s_glob.complete_load(prep["load_id"])["pages"][0]["data"] == g_pages[0]["data"]
    globex.close()
