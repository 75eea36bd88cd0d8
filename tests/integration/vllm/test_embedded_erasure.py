"""A tenant's erasure reaches a vLLM engine's embedded store when the engine is given the
service's key directory (``keys_dir``): the erasure's mark there voids every token of the
tenant issued before it, in the scheduler (new requests) and in the store (requests
already in flight), and the store drops the tenant's blocks, zeroing them in the host
pool and the NVMe shard. The embedded backend used to ignore erasures entirely: the
blocks stayed readable, by the old token and by a new one of the tenant created anew,
and in plain text in the shard's files (found from outside). Real host pool (/dev/shm)
and NVMe shard files."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agentkv_cluster.engines.vllm.backend import CallerRefused
from agentkv_cluster.engines.vllm.config import ConnectorConfig, ConnectorConfigError
from agentkv_cluster.engines.vllm.directory import TenantErasures, TokenResolver
from agentkv_cluster.engines.vllm.embedded import EmbeddedBackend, EmbeddedSpec
from security.keyring import FileKeySource, TenantKeyring
from security.principals import TokenIssuer
from tests.integration.vllm.test_backend_contract import PAGE, TOKENS, _ids, _page

pytestmark = pytest.mark.integration
SECRET = b"k" * 32


def _token(tenant: str) -> str:
    return TokenIssuer(SECRET).issue(tenant, subject="agent", now=time.time())


def _setup(tmp_path: Path) -> tuple[TenantKeyring, TokenResolver, EmbeddedBackend]:
    """Tenants acme and globex in a key directory, and an embedded store given it."""
    keys = tmp_path / "keys"
    ring = TenantKeyring(FileKeySource(keys))
    for tenant in ("acme", "globex"):
        ring.create_tenant(tenant)
    resolver = TokenResolver(SECRET, None, TenantErasures(str(keys)))
    store = EmbeddedBackend(EmbeddedSpec(slot_bytes=PAGE, host_blocks=2, nvme_blocks=4,
                                         nvme_dir=str(tmp_path / "nv"), keys_dir=str(keys)))
    return ring, resolver, store


def test_an_erasure_voids_earlier_tokens_and_drops_the_tenants_blocks(tmp_path: Path):
    ring, resolver, store = _setup(tmp_path)
    try:
        old_token = _token("acme")
        old, other = resolver.resolve(old_token, "s"), resolver.resolve(_token("globex"), "g")
        mine, theirs = _ids(TOKENS, "acme"), _ids(TOKENS, "globex", 1)
        pages = [_page(ident, i) for i, ident in enumerate(mine)]
        for ident, page in zip(mine, pages):  # four blocks: two spill to the NVMe shard
            store.put(old, ident, page)
        store.put(other, theirs[0], _page(theirs[0], 99))
        assert store.stats()["nvme_blocks"] >= 2
        time.sleep(0.01)
        ring.mark_erased("acme", time.time())  # what ``agentkv tenant erase`` leaves
        time.sleep(0.01)
        with pytest.raises(CallerRefused, match="erased after this request's token"):
            resolver.resolve(old_token, "s")  # a new request with the old token
        with pytest.raises(CallerRefused, match="erased"):
            store.get(old, mine[0])  # a request admitted before the erasure
        new = resolver.resolve(_token("acme"), "s")  # the tenant created anew
        assert store.lookup(new, mine) == 0 and store.get(new, mine[0]) is None
        assert store.get(other, theirs[0]) == _page(theirs[0], 99)  # untouched
        assert store.stats()["blocks"] == 1
        shard = b"".join(f.read_bytes() for f in (tmp_path / "nv").rglob("*") if f.is_file())
        for page in pages:  # zeroed where they lay, not only forgotten
            assert page[-256:] not in shard
    finally:
        store.close()


def test_an_erased_tenants_blocks_leave_no_bytes_in_the_host_pool(tmp_path: Path):
    """A freed host slot keeps its bytes until reused, so the store scrubs every free slot
    (``scrub_free``): the pool's shared-memory mapping itself is searched for the erased
    blocks (what a core dump or a reader of the process's memory would find)."""
    ring, resolver, store = _setup(tmp_path)
    try:
        acme, other = resolver.resolve(_token("acme"), "s"), resolver.resolve(_token("globex"), "g")
        mine, theirs = _ids(TOKENS, "acme"), _ids(TOKENS, "globex", 1)
        pages = [_page(ident, i) for i, ident in enumerate(mine[:2])]
        for ident, page in zip(mine, pages):  # two blocks: both in the host pool
            store.put(acme, ident, page)
        pool = lambda: bytes(store._pool._bytes)  # the shared-memory mapping's bytes
        assert all(page[-256:] in pool() for page in pages)  # control: they lie there
        time.sleep(0.01)
        ring.mark_erased("acme", time.time())  # what ``agentkv tenant erase`` leaves
        time.sleep(0.01)
        store.put(other, theirs[0], _page(theirs[0], 99))  # another tenant's call sees it
        assert store.get(other, theirs[0]) == _page(theirs[0], 99)
        left = pool()
        for page in pages:
            assert page[-256:] not in left, "an erased tenant's block is still in the host pool"
    finally:
        store.close()


def test_keys_dir_must_be_a_directory(tmp_path: Path):
    with pytest.raises(ConnectorConfigError, match="keys_dir"):
        ConnectorConfig.from_extra({"keys_dir": str(tmp_path / "absent")})
    with pytest.raises(ConnectorConfigError, match="embedded backend only"):
        ConnectorConfig.from_extra({"backend": "service", "service_address": "h:1",
                                    "keys_dir": str(tmp_path)})
