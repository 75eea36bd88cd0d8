"""The service's erasure leaves nothing of the tenant's namespace on a real redis-server.

``ClusterErasure`` runs here with stand-in controller and pool (the tiers before the
directory are covered by ``test_erase_live``); the directory is a real Redis, written by
the same ``RedisDirectory`` PUT the pools use, so its ``meta``, generation sets and
per-node write counts ``w:<node>`` exist before the erasure. Afterwards the test lists
every key left: the other tenant's, and none of the erased one's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis as redis_py

from agentkv_cluster.runtime.directory_glue import RedisSpec
from agentkv_cluster.runtime.erasure import ClusterErasure
from agentkv_cluster.runtime.erasure_receipts import ControllerErased, PoolPurged, TenantForgotten
from security.audit import AuditLog
from security.blinding import DirectoryBlinder
from security.erasure import verify_receipt
from security.keyring import FileKeySource, TenantKeyring
from security.signing import Signer, Verifier
from store.directory import DirectoryEntry
from store.directory.redis_backend import RedisDirectory
from store.types import Codec, Tier
from tests.support.redis_proc import RedisProcess

pytestmark = pytest.mark.integration
PREFIX = "akv"


@pytest.fixture(scope="module")
def redis():
    server = RedisProcess().start()
    yield server
    server.close()


class _Controller:
    def __init__(self) -> None:
        self.frozen: list[str] = []

    def options(self, *, timeout_s: float | None) -> _Controller:
        return self

    def freeze_tenant(self, tenant: str) -> None:
        self.frozen.append(tenant)

    def thaw_tenant(self, tenant: str) -> None:
        self.frozen.remove(tenant)

    def erase_tenant(self, tenant: str) -> ControllerErased:
        gone = TenantForgotten(keys={}, pages=0, resident=0, sessions=0, pins=0, cancelled=0,
                               straggling=0)
        return ControllerErased(forgotten=gone, hbm_pages=0, hbm_free_zeroed=0, hbm_actors=0)


class _Pool:
    def __init__(self, keys: list[bytes], reported: int) -> None:
        self.keys = keys
        self.reported = reported  # how many of its keys it names to the erasure

    def options(self, *, timeout_s: float | None) -> _Pool:
        return self

    def purge_tenant(self, tenant: str, generation: int | None = None) -> PoolPurged:
        return PoolPurged(copies=tuple((k, 0) for k in self.keys[:self.reported]),
                          host=len(self.keys), nvme=0,
                          host_free_zeroed=0, nvme_dead_zeroed=0, staging_zeroed=0)


class _Topology:
    def __init__(self, url: str, keys: list[bytes], reported: int) -> None:
        self.controller = _Controller()
        self.pools = {"pool-0": _Pool(keys, reported)}
        self.directory = RedisSpec(url=url, prefix=PREFIX)


def _fill(d: RedisDirectory, namespace: str, node: str, keys: list[bytes],
          refcount: int = 0) -> None:
    gen = d.open_generation(namespace)
    for i, key in enumerate(keys):
        d.put(DirectoryEntry(key=key, tenant_ns=namespace, tier=Tier.HOST, node=node,
                             location=f"pool:{i}", codec=Codec.FULL, size_bucket=1,
                             generation=gen, refcount=refcount if i == 0 else 0))
    d.seal_generation(namespace, gen)  # an older generation with entries, and a newer one
    d.open_generation(namespace)


def _keys_of(admin: redis_py.Redis, namespace: str) -> list[bytes]:
    return sorted(admin.scan_iter(match=f"{PREFIX}:{{{namespace}}}:*"))


# every entry named by the pools and unreferenced (the namespace's meta, generation sets
# and write counts must still go); an entry no pool names (its pool gone) and one still
# referenced (a pin the controller's part did not release) go too
@pytest.mark.parametrize(("reported", "refcount"), [(5, 0), (1, 1)],
                         ids=["all-entries-named", "unnamed-and-referenced-entries"])
def test_service_erasure_leaves_no_key_of_the_tenant_namespace(
        redis, tmp_path: Path, reported: int, refcount: int) -> None:
    keys_dir = tmp_path / "keys"
    keyring = TenantKeyring(FileKeySource(str(keys_dir)))
    for tenant in ("acme", "globex"):
        keyring.create_tenant(tenant)
    blinder = DirectoryBlinder(keyring)
    erased, kept = blinder.namespace("acme"), blinder.namespace("globex")
    keys = [bytes([i]) * 32 for i in range(1, 6)]
    d = RedisDirectory(redis.url, prefix=PREFIX)
    _fill(d, erased, "node-a", keys, refcount)
    _fill(d, erased, "node-b", keys[:2])  # a second node's write count
    _fill(d, kept, "node-a", keys[:2])
    d.close()
    admin = redis_py.Redis.from_url(redis.url)
    before = {k.decode().split(":", 2)[2] for k in _keys_of(admin, erased)}
    assert {"meta", "gens", "w:node-a", "w:node-b"} <= before  # the test's premise
    kept_before = _keys_of(admin, kept)

    signer = Signer.generate()
    erasure = ClusterErasure(_Topology(redis.url, keys, reported), None, str(keys_dir),
                             AuditLog(tmp_path / "audit.log", signer), signer)
    receipt = erasure.erase("acme")

    left = _keys_of(admin, erased)
    assert left == [], f"keys of the erased namespace left in Redis: {left}"
    assert _keys_of(admin, kept) == kept_before  # the other tenant untouched
    counts = dict(receipt.counts)
    assert receipt.failed_tiers == () and counts["directory"] == len(keys)
    assert verify_receipt(receipt.to_json(), Verifier(signer.public_raw())).tenant == "acme"
    admin.close()


@pytest.mark.parametrize("backend", ["embedded", "redis"])
def test_delete_namespace_drops_entries_whatever_their_references(redis, backend) -> None:
    """The directory step's own operation on both backends: the count of entries removed,
    the namespace as if never written, the other namespace untouched."""
    from store.directory import DeletesNamespaces, EmbeddedDirectory
    from store.types import Lookup

    d = EmbeddedDirectory() if backend == "embedded" else RedisDirectory(redis.url, prefix="t")
    keys = [bytes([i]) * 32 for i in range(1, 4)]
    try:
        assert isinstance(d, DeletesNamespaces)
        _fill(d, "ns-gone", "node-a", keys, refcount=2)
        _fill(d, "ns-kept", "node-a", keys[:1])
        assert d.delete_namespace("ns-gone") == len(keys)
        assert d.get_many("ns-gone", keys) == [(Lookup.MISS, None)] * len(keys)
        assert d.current_generation("ns-gone") == 0 and d.reclaimable("ns-gone") == []
        assert d.get("ns-kept", keys[0])[0] is Lookup.HIT
        assert d.delete_namespace("ns-gone") == 0  # twice: nothing left to remove
    finally:
        d.close()
