"""Fixtures for the security unit tests: a real key directory on disk per test."""

from __future__ import annotations

import pytest

from security.keyring import FileKeySource, KeyringConfig, TenantKeyring
from security.sealing import TenantSealer
from security.signing import Signer


@pytest.fixture
def keyring(tmp_path) -> TenantKeyring:
    ring = TenantKeyring(FileKeySource(tmp_path / "keys"))
    for tenant in ("alice", "bob"):
        ring.create_tenant(tenant)
    return ring


@pytest.fixture
def sealer(keyring) -> TenantSealer:
    return TenantSealer(keyring)


@pytest.fixture
def signer() -> Signer:
    return Signer.generate()


@pytest.fixture
def small_budget_keyring(tmp_path) -> TenantKeyring:
    ring = TenantKeyring(FileKeySource(tmp_path / "keys"), KeyringConfig(nonce_limit=3))
    ring.create_tenant("alice")
    return ring
