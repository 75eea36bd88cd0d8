"""Tenant key provisioning: a tenant's keys are made on first use.

The front provisions a tenant when it opens its first session (and the shared PUBLIC
namespace when a grant publishes to it); in Kubernetes the key directory is a read-only
Secret and the operator provisions tenants instead (``TenantNotProvisioned``).
"""

from __future__ import annotations

import errno

from agentkv_cluster.api.errors import NoRoom, TenantNotProvisioned
from security.errors import KeyExists, KeyUnavailable
from security.keyring import FileKeySource, TenantKeyring


def ensure_tenant(keys_dir: str, tenant: str) -> None:
    """Create the tenant's keys on first use (idempotent across racing processes).

    Raises ``TenantNotProvisioned`` when they cannot be created: in Kubernetes the key
    directory is a read-only Secret and tenants are provisioned by the operator;
    ``NoRoom`` when the directory is writable but refused them now (a full disk).
    """
    try:
        keyring = TenantKeyring(FileKeySource(keys_dir))
        if keyring.generations(tenant):
            return
        keyring.create_tenant(tenant)
    except KeyExists:
        pass
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):  # a full disk: later
            raise NoRoom(f"tenant {tenant!r} cannot be provisioned now: the key directory "
                         f"refused its keys ({exc.strerror}); retry later") from None
        raise TenantNotProvisioned(tenant) from None
    except KeyUnavailable:  # a key directory opened read-only
        raise TenantNotProvisioned(tenant) from None
