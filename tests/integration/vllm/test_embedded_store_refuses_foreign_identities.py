"""The worker-side embedded store refuses, on every
read path, an identity in another tenant's namespace: identities are derived from the
prompt's tokens and the namespace name, so a tenant that knows (or guesses) another's
prompt can name its blocks. ``get`` must not return the bytes and ``contains`` must not
answer whether they are held (a cross-tenant existence oracle); the owner still reads
them. Real host pool (/dev/shm), real tokens."""

from __future__ import annotations

import secrets
import time

import pytest

from agentkv_cluster.engines.vllm.backend import CallerRefused
from agentkv_cluster.engines.vllm.directory import TokenResolver
from agentkv_cluster.engines.vllm.embedded import EmbeddedBackend, EmbeddedSpec
from security.principals import TokenIssuer
from tests.integration.vllm.test_backend_contract import PAGE, TOKENS, _ids, _page

pytestmark = pytest.mark.integration


def test_another_tenants_blocks_are_neither_read_nor_confirmed() -> None:
    secret = secrets.token_bytes(32)
    issuer, resolver = TokenIssuer(secret), TokenResolver(secret, default_tenant=None)
    caller = lambda t, **kw: resolver.resolve(
        issuer.issue(t, subject="agent", now=time.time(), **kw), "s")
    store = EmbeddedBackend(EmbeddedSpec(slot_bytes=PAGE, host_blocks=4, nvme_blocks=8))
    try:
        a = caller("acme")
        ids_a = _ids(TOKENS, "acme", 2)
        for i, ident in enumerate(ids_a):
            store.put(a, ident, _page(ident, i))
        assert store.get(a, ids_a[0]) == _page(ids_a[0], 0) and store.contains(a, ids_a[0])
        for b in (caller("globex"), caller("globex", public_read=True)):
            with pytest.raises(CallerRefused):
                store.get(b, ids_a[0])
            with pytest.raises(CallerRefused):
                store.contains(b, ids_a[1])
        assert store.get(a, ids_a[1]) == _page(ids_a[1], 1)  # the owner is untouched
    finally:
        store.close()
