"""Per-tenant Redis ACL users limited to ``<prefix>:{<ns>}:*`` (the directory's key
prefix, ``akv`` by default).

The braces are literal, as in the store's Redis directory layout: a Redis
Cluster hash tag keeps a namespace's keys in one slot, and the ACL glob matches
them verbatim.

A tenant's user may read and write its own keys (plain commands, MULTI/EXEC and
Lua; Redis 7 checks script key access against the same ACL) and nothing that
lists, counts or describes the keyspace, other clients or the server. The
rules are generated here and applied with ``ACL SETUSER`` or written to an
ACL file; ``security`` does not import redis: ``apply_users`` takes any client
with ``execute_command``.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from security.errors import InvalidName

# Denied by the issue, plus the other commands that reveal keys, clients or server state.
DENIED_COMMANDS: tuple[str, ...] = (
    "scan", "keys", "dbsize", "info", "slowlog", "client", "monitor", "config", "debug",
    "object", "randomkey", "memory", "latency", "pubsub", "select", "swapdb", "move",
    "migrate", "flushdb", "flushall", "sort", "sort_ro", "script|flush", "script|kill",
    "function", "lastsave", "role", "command", "acl",
)
_NS_RE = re.compile(r"[a-z0-9_-]{1,64}")
_USER_RE = re.compile(r"[a-z0-9_-]{1,80}")


@dataclass(frozen=True, kw_only=True)
class TenantAclUser:
    username: str
    password: str = ""  # plaintext, handed to the tenant's service process once
    namespace: str
    prefix: str = "akv"  # the directory's key prefix (``directory.prefix``)

    @property
    def key_pattern(self) -> str:
        return f"{self.prefix}:{{{self.namespace}}}:*"


def make_user(namespace: str, *, username: str | None = None, password: str | None = None,
              prefix: str = "akv") -> TenantAclUser:
    """A user for one directory namespace with a fresh random password by default."""
    if not _NS_RE.fullmatch(namespace) or not _NS_RE.fullmatch(prefix):
        raise InvalidName(f"invalid directory namespace: {namespace!r:.70}:{prefix!r:.70}")
    username = username or f"akv-{namespace}"
    if not _USER_RE.fullmatch(username):
        raise InvalidName(f"invalid ACL user name: {username!r:.70}")
    return TenantAclUser(username=username, password=password or secrets.token_urlsafe(32),
                         namespace=namespace, prefix=prefix)


def acl_rules(user: TenantAclUser) -> list[str]:
    """The ``ACL SETUSER`` rules, in order (later rules override earlier ones)."""
    digest = hashlib.sha256(user.password.encode()).hexdigest()
    rules = ["reset", "on", f"#{digest}", f"~{user.key_pattern}", "resetchannels",
             "-@all", "+@read", "+@write", "+@string", "+@hash", "+@list", "+@set",
             "+@sortedset", "+@transaction", "+@scripting", "+ping", "+hello", "+auth",
             "+echo", "+reset", "+quit", "-@admin", "-@dangerous"]
    rules += [f"-{cmd}" for cmd in DENIED_COMMANDS]
    return rules


def acl_file_line(user: TenantAclUser) -> str:
    """One line of a Redis ``aclfile`` (``reset`` is implied there)."""
    return " ".join(["user", user.username] + acl_rules(user)[1:])


class _Client(Protocol):
    def execute_command(self, *args: object) -> object: ...


def apply_users(admin: _Client, users: Iterable[TenantAclUser]) -> None:
    """Create or replace each user on a live server (needs an admin connection)."""
    for user in users:
        admin.execute_command("ACL", "SETUSER", user.username, *acl_rules(user))


def remove_users(admin: _Client, users: Iterable[TenantAclUser]) -> None:
    names = [u.username for u in users]
    if names:
        admin.execute_command("ACL", "DELUSER", *names)
