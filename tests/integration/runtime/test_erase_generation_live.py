"""Erasing one key generation (``agentkv tenant erase T --generation G``) while the service
runs: its pool actors forget that generation's cached keys and drop the copies sealed under
it, so nothing sealed under it is served again. Before, the pools kept the key they had
cached and restored such pages as before: the erasure had no effect until a restart
(found by review). Pages resident in HBM are sealed under no generation and stay; pages
sealed under the newer generation are untouched."""

from __future__ import annotations

import json
import time

import pytest

from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.cli import main
from security.blinding import DirectoryBlinder
from security.keyring import FileKeySource, TenantKeyring
from store.types import Lookup
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.integration.runtime.test_erase import _tiers_holding
from tests.integration.runtime.test_public_mark import PAGE
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


def _cli(service, *args: str) -> int:
    return main(["tenant", *args, "--keys-dir", service.keys_dir,
                 "--audit-log", str(service.workdir / "audit.log"),
                 "--signing-key", str(service.workdir / "audit.key")])


def _enforced(service) -> list[dict]:
    lines = (service.workdir / "audit.log").read_text().splitlines()
    return [r["data"] for r in map(json.loads, lines) if r["kind"] == "erasure.enforced"]


def _sealed_under(service, generation: int) -> dict[bytes, set[int]]:
    """Each page key the pools hold copies of -> the generations they are sealed under."""
    out: dict[bytes, set[int]] = {}
    for pool in service.topo.pools.values():
        for (key, _codec), copy in pool.target._index.items():
            out.setdefault(key, set()).add(copy.seal_gen)
    return out


def test_a_generation_erased_while_the_service_runs_is_served_no_more() -> None:
    with local_service("agentkv-erase-gen-", page_bytes=PAGE, hbm_pages=16,
                       pool_bytes=12 * PAGE, hbm_capacity=3 * PAGE) as service, \
            service.client("acme") as client:
        s = client.open_session("g1")
        old = [kv_page(i, "evidence", identity("acme", "g1", 1000 * i)) for i in range(5)]
        old_keys = s.store_pages(old)  # generation 1; three fit HBM, two go to the pool
        sealed = _tiers_holding(service, old_keys)
        assert sealed["host"] + sealed["nvme"] >= 2, sealed
        assert _cli(service, "rotate", "acme") == 0
        new = [kv_page(10 + i, "evidence", identity("acme", "g1", 50_000 + 1000 * i))
               for i in range(3)]
        new_keys = s.store_pages(new)  # generation 2: pushes generation 1 pages out too
        assert s.load(old_keys[:1]) == [old[0]["data"]]  # still served: nothing erased yet
        s.release(old_keys[:1])

        before = _sealed_under(service, 1)
        resident = {k for k in old_keys if _tiers_holding(service, [k])["hbm"]}
        only_g1 = [k for k in old_keys if before.get(k) == {1} and k not in resident]
        assert only_g1, (before, resident)  # pages whose only copy is sealed under it
        raw = {k: p["identity"] for k, p in zip(old_keys, old)}
        assert all(s.lookup_prefix([raw[k]])["length"] == 1 for k in old_keys)

        assert _cli(service, "erase", "acme", "--generation", "1") == 0

        deadline = time.monotonic() + 10.0
        while not [d for d in _enforced(service) if d.get("generation") == 1]:
            assert time.monotonic() < deadline, "the service did not enforce the erasure"
            time.sleep(0.1)
        (record,) = _enforced(service)
        assert (record["tenant"], record["scope"], record["failed_tiers"]) == \
            ("acme", "generation", [])
        pooled = dict(record["counts"])
        assert pooled["host"] + pooled["nvme"] >= 1
        after = _sealed_under(service, 1)
        assert not any(1 in gens for gens in after.values()), after
        assert pooled["host"] + pooled["nvme"] == sum(1 in g for g in before.values())
        namespace = DirectoryBlinder(TenantKeyring(FileKeySource(service.keys_dir))
                                     ).namespace("acme")
        directory = service.topo.directory
        assert all(directory.get(namespace, k)[0] is Lookup.MISS for k in only_g1)
        assert all(directory.get(namespace, k)[0] is Lookup.HIT for k in new_keys
                   if k in after)  # the pages sealed under generation 2 stay listed
        # A prefix lookup stops before a page left with no copy (it counted them, and
        # their loads were page_lost); pages resident in HBM still count.
        assert [s.lookup_prefix([raw[k]])["length"] for k in old_keys] == \
            [0 if k in only_g1 else 1 for k in old_keys]
        for key in only_g1:  # no copy sealed under generation 1 is opened again
            with pytest.raises(RemoteError) as err:
                s.load([key])
            assert err.value.code in ("page_lost", "not_found"), err.value
        assert s.load(new_keys) == [p["data"] for p in new]  # generation 2 is untouched


def test_pages_of_a_tenant_whose_every_generation_is_erased_leave_hbm_when_pressed() -> None:
    """Its HBM pages cannot be sealed for a lower tier any more. Before, each pressure
    demotion failed (KeyUnavailable) and put the page back into the budget another
    tenant's store had just taken its room from: the HBM actor held twice its budget.
    Such a page now goes (its load is page_lost; the engine re-prefills)."""
    with local_service("agentkv-erase-last-gen-", page_bytes=PAGE, hbm_pages=16,
                       pool_bytes=12 * PAGE, hbm_capacity=3 * PAGE) as service, \
            service.client("acme") as acme, service.client("globex") as globex:
        a = acme.open_session("a")
        keys = a.store_pages([kv_page(i, "evidence", identity("acme", "a", 1000 * i))
                              for i in range(3)])  # HBM full
        assert _cli(service, "erase", "acme", "--generation", "1") == 0  # its only one
        g = globex.open_session("g")
        mine = [kv_page(10 + i, "evidence", identity("globex", "g", 1000 * i))
                for i in range(3)]
        assert g.load(g.store_pages(mine)) == [p["data"] for p in mine]
        used = service.topo.controller.stats()["hbm_used"]
        assert sum(used.values()) <= 3 * PAGE, used
        with pytest.raises(RemoteError) as err:
            a.load(keys[:1])
        assert err.value.code == "page_lost", err.value
