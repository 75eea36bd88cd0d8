"""An erasure seen by a vLLM engine's embedded store
zeroes the tenant's blocks in the host pool too, not only in the NVMe shard: a freed host
slot keeps its bytes until reused, so the store scrubs every free slot
(``EmbeddedBackend._alive``: ``scrub_free``). The existing test reads only the shard's
files; here the pool's shared-memory mapping itself is searched for the erased pages
(what a core dump or a reader of the process's memory would find). Real host pool
(/dev/shm) and NVMe shard files."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agentkv_cluster.engines.vllm.directory import TenantErasures, TokenResolver
from agentkv_cluster.engines.vllm.embedded import EmbeddedBackend, EmbeddedSpec
from security.keyring import FileKeySource, TenantKeyring
from security.principals import TokenIssuer
from tests.integration.vllm.test_backend_contract import PAGE, TOKENS, _ids, _page

pytestmark = pytest.mark.integration
SECRET = b"k" * 32


def _token(tenant: str) -> str:
    return TokenIssuer(SECRET).issue(tenant, subject="agent", now=time.time())


def test_an_erased_tenants_blocks_leave_no_bytes_in_the_host_pool(tmp_path: Path):
    keys = tmp_path / "keys"
    ring = TenantKeyring(FileKeySource(keys))
    for tenant in ("acme", "globex"):
        ring.create_tenant(tenant)
    resolver = TokenResolver(SECRET, None, TenantErasures(str(keys)))
    store = EmbeddedBackend(EmbeddedSpec(slot_bytes=PAGE, host_blocks=2, nvme_blocks=4,
                                         nvme_dir=str(tmp_path / "nv"), keys_dir=str(keys)))
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
