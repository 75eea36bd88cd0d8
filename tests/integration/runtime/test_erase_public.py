"""Erasing the PUBLIC namespace on a running service takes its pages from every tier,
HBM included. A PUBLIC page's record names the tenant whose session stored or adopted it
(a publisher, a reader), never PUBLIC, and the controller dropped pages by that tenant:
after ``erase _public`` the pages stayed resident, and a reader that held one loaded its
plaintext again, a load prepared before the erasure included (found by review)."""

from __future__ import annotations

import pytest

from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.cli import main
from security.keyring import PUBLIC_NAMESPACE
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.integration.runtime.test_erase import _tiers_holding
from tests.integration.runtime.test_public_mark import PAGE, PUBLISHER, _store_eventually
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


def test_erasing_public_takes_its_pages_from_hbm_and_from_readers_loads() -> None:
    with local_service("agentkv-erase-public-", page_bytes=PAGE, hbm_pages=16,
                       pool_bytes=8 * PAGE) as service:
        for command in (["create", "initech"], ["publish", "initech"]):
            assert main(["tenant", *command, "--keys-dir", service.keys_dir,
                         "--audit-log", str(service.workdir / "audit.log"),
                         "--signing-key", str(service.workdir / "audit.key")]) == 0
        pages = [kv_page(i * 128, "fixed_prefix", identity(PUBLIC_NAMESPACE, "tools", i * 128))
                 for i in range(2)]
        idents = [identity(PUBLIC_NAMESPACE, "tools", i * 128).pack() for i in range(2)]
        with service.client("initech", roles=PUBLISHER) as pub, \
                service.client("umbrella", public_read=True) as reader, \
                service.client("acme") as bystander:
            p = pub.open_session("p1")
            for page in pages:
                _store_eventually(p, page, ok=True)
            r = reader.open_session("r1")
            found = r.lookup_prefix(idents)
            keys = found["keys"]
            assert found["length"] == 2 and r.load(keys) == [pg["data"] for pg in pages]
            r.release(keys)
            prepared = r.prepare_load(keys[:1])  # pinned, not yet served
            own = bystander.open_session("a1")
            own_page = kv_page(7, "evidence", identity("acme", "a1", 0))  # other bytes
            own_keys = own.store_pages([own_page])
            held = _tiers_holding(service, keys)
            assert held["hbm"] >= 2, held
            arena = service.topo.hbms["node0-hbm0"].target.arena.buffer.numpy().tobytes()
            marks = [pg["data"][4096:4160] for pg in pages]
            assert all(m in arena for m in marks)

            receipt = service.erase_tenant(PUBLIC_NAMESPACE)

            assert receipt.failed_tiers == () and dict(receipt.counts)["hbm"] >= 2
            assert _tiers_holding(service, keys) == {"hbm": 0, "host": 0, "nvme": 0}
            arena = service.topo.hbms["node0-hbm0"].target.arena.buffer.numpy().tobytes()
            assert not any(m in arena for m in marks)
            with pytest.raises(RemoteError) as err:  # prepared before: served nothing
                r.complete_load(prepared["load_id"])
            assert err.value.code == "not_found"
            with pytest.raises(RemoteError) as err:
                r.prepare_load(keys)
            assert err.value.code == "not_found"
            assert r.lookup_prefix(idents)["length"] == 0
            assert own.load(own_keys) == [own_page["data"]]  # a tenant's own pages stay
