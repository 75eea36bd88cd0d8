"""The scheduler-side ``EmbeddedDirectory`` (the mirror
of what the embedded store holds) answers ``lookup`` and ``contains`` only for identities
a caller may read: another tenant's block, held, is neither counted nor confirmed (a
cross-tenant existence oracle), PUBLIC only with the opt-in. Real tokens, no mocks."""

from __future__ import annotations

import secrets
import time

import pytest

from agentkv_cluster.engines.vllm.backend import CallerRefused
from agentkv_cluster.engines.vllm.directory import EmbeddedDirectory, TokenResolver
from security.keyring import PUBLIC_NAMESPACE
from security.principals import TokenIssuer
from tests.integration.vllm.test_backend_contract import TOKENS, _ids


def test_the_scheduler_mirror_confirms_nothing_across_tenants() -> None:
    secret = secrets.token_bytes(32)
    issuer = TokenIssuer(secret)
    directory = EmbeddedDirectory(TokenResolver(secret, default_tenant=None))
    caller = lambda t, **kw: directory.resolve(
        issuer.issue(t, subject="agent", now=time.time(), **kw), "s")
    a, b, opted = caller("acme"), caller("globex"), caller("globex", public_read=True)
    ids_a, pub = _ids(TOKENS, "acme", 2), _ids(TOKENS, PUBLIC_NAMESPACE, 1)
    for ident in ids_a + pub:
        directory.expect(ident)
    assert directory.contains(a, ids_a[0]) and directory.lookup(a, ids_a) == 2  # control
    assert directory.contains(opted, pub[0])  # PUBLIC with the opt-in
    for who in (b, opted):
        with pytest.raises(CallerRefused):
            directory.contains(who, ids_a[0])
        with pytest.raises(CallerRefused):
            directory.lookup(who, ids_a)
    with pytest.raises(CallerRefused):
        directory.contains(b, pub[0])  # PUBLIC without the opt-in
