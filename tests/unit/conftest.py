"""Fixtures of the unit suites' CLI tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from security.keyring import FileKeySource, TenantKeyring
from security.signing import write_keypair


@pytest.fixture
def admin_files(tmp_path: Path) -> dict[str, str]:
    """A key pair, a key directory holding tenant acme, and the audit options for them."""
    write_keypair(tmp_path / "sk.pem", tmp_path / "pk.pem")
    TenantKeyring(FileKeySource(tmp_path / "keys")).create_tenant("acme")
    return {"keys": str(tmp_path / "keys"), "log": str(tmp_path / "ops.log"),
            "sk": str(tmp_path / "sk.pem"), "pk": str(tmp_path / "pk.pem")}
