"""Per-tenant Redis ACL users for the directory, kept in step with the key directory.

When the service runs on a Redis directory, every tenant with keys gets a Redis user
``akv-<blinded ns>`` confined to ``akv:{<ns>}:*`` (``security.redis_acl`` rules). The
password is written once, 0600, to ``<state>/redis-users/<tenant>.json`` for the
tenant's own tools; a tenant erased (its keys gone) loses its user and that file, also
one erased while no service ran (``agentkv tenant erase`` offline): its file outlives
the run that made the user, and the next reconcile removes both.
The admin connection is the service's own directory URL; without ACL rights the users
are not made (logged once) and the service runs on.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path

import redis

from security.blinding import DirectoryBlinder
from security.errors import SecurityError
from security.keyring import FileKeySource, TenantKeyring
from security.redis_acl import TenantAclUser, apply_users, make_user, remove_users

log = logging.getLogger(__name__)


class TenantRedisUsers:
    """Creates and removes the tenants' Redis users (``reconcile``, ``remove``)."""

    def __init__(self, url: str, keys_dir: str, out_dir: Path, prefix: str = "akv") -> None:
        """``prefix``: the directory's key prefix (``directory.prefix``)."""
        self.url = url
        self.prefix = prefix
        self.keys_dir = keys_dir
        self.out_dir = out_dir
        self._admin: redis.Redis | None = None
        self._users: dict[str, TenantAclUser] = {}  # tenant -> user applied
        self.disabled = ""  # why users are not made (no ACL rights), once known
        self._lock = threading.Lock()  # the watcher reconciles while an erasure removes
        self._next_check = 0  # which applied user the next reconcile asks Redis about

    def _connect(self) -> redis.Redis:
        if self._admin is None:
            self._admin = redis.Redis.from_url(self.url)
        return self._admin

    def reconcile(self) -> tuple[list[str], list[str]]:
        """Make users for new tenants, drop those of erased ones; (made, removed)."""
        with self._lock:
            return self._reconcile()

    def _reconcile(self) -> tuple[list[str], list[str]]:
        if self.disabled:
            return [], []
        try:
            self._forget_lost()
        except redis.RedisError:  # unreachable now (or no right to ask): the next pass asks
            pass
        keyring = TenantKeyring(FileKeySource(self.keys_dir, writable=False))
        tenants = set(keyring.tenants())
        removed: list[str] = []
        for tenant in erased_users(self._users, self._files(), tenants):
            try:
                self._remove(tenant)
            except redis.ResponseError as exc:  # NOPERM: the service's user is no admin
                self.disabled = f"cannot remove Redis users: {exc}"
                log.warning("%s; an erased tenant's user stays", self.disabled)
                return [], removed
            except redis.RedisError:  # unreachable now: its file stays, the next pass tries
                return [], removed
            removed.append(tenant)
        made = []
        blinder = DirectoryBlinder(keyring)
        for tenant in sorted(tenants - set(self._users)):
            try:
                user = self._user(tenant, blinder.namespace(tenant))
                apply_users(self._connect(), [user])
            except SecurityError:
                continue  # erased between the listing and now
            except redis.ResponseError as exc:  # NOPERM: the service's user is no admin
                self.disabled = f"cannot create Redis users: {exc}"
                log.warning("%s; tenants share the service's Redis user", self.disabled)
                return made, removed
            except redis.RedisError:  # unreachable now: the next reconcile tries again
                return made, removed
            self._users[tenant] = user
            made.append(tenant)
        return made, removed

    def _forget_lost(self) -> None:
        """Drop from ``_users`` what Redis no longer has, so this pass makes it again (with
        the password of its file). ``ACL SETUSER`` users live in the server's memory only:
        a restart, even from an RDB or AOF, or a replica promoted in a failover loses every
        one of them, and they used to stay gone until the service restarted. One applied
        user is asked about per pass, in turn; when it is gone, all of them are listed."""
        if not self._users:
            return
        tenants = sorted(self._users)
        tenant = tenants[self._next_check % len(tenants)]
        self._next_check += 1
        admin = self._connect()
        if admin.execute_command("ACL", "GETUSER", self._users[tenant].username) is not None:
            return
        present = {u.decode() if isinstance(u, bytes) else u
                   for u in admin.execute_command("ACL", "USERS")}
        lost = [name for name in tenants if self._users[name].username not in present]
        for name in lost:
            del self._users[name]
        log.warning("Redis lost %d tenant user(s) (restarted or failed over); making them "
                    "again", len(lost))

    def remove(self, tenant: str) -> int:
        """Drop ``tenant``'s Redis user and credentials file (erasure); 1 if it had one."""
        with self._lock:
            return self._remove(tenant)

    def _remove(self, tenant: str) -> int:
        user = self._users.get(tenant)
        path = self.out_dir / f"{tenant}.json"
        if user is None and path.exists():  # made by an earlier run of the service
            try:
                user = TenantAclUser(**json.loads(path.read_text()))
            except (ValueError, TypeError):
                user = None
        if user is not None and not self.disabled:
            remove_users(self._connect(), [user])  # raises while Redis is unreachable
        self._users.pop(tenant, None)
        path.unlink(missing_ok=True)
        return int(user is not None)

    def _files(self) -> list[str]:
        """The tenants with a credentials file (made by this run or an earlier one)."""
        try:
            return [p.stem for p in self.out_dir.glob("*.json")]
        except OSError:
            return []

    def _user(self, tenant: str, namespace: str) -> TenantAclUser:
        """The tenant's user: the password of an earlier run when its namespace matches."""
        path = self.out_dir / f"{tenant}.json"
        try:
            old = TenantAclUser(**json.loads(path.read_text()))
            if (old.namespace, old.prefix) == (namespace, self.prefix):
                return old
        except (OSError, ValueError, TypeError):
            pass
        user = make_user(namespace, prefix=self.prefix)
        self.out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"username": user.username, "password": user.password,
                       "namespace": user.namespace, "prefix": user.prefix}, f)
        tmp.replace(path)
        return user

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None


def erased_users(applied: Iterable[str], files: Iterable[str], tenants: set[str]) -> list[str]:
    """The tenants whose Redis user goes: made by this run (``applied``) or named by a
    credentials file (``files``: an earlier run made it), and without keys now."""
    return sorted((set(applied) | set(files)) - tenants)
