"""Principals from signed tokens, and the namespace access check.

The tenant of a request is the tenant in its verified token, never a request
field. The PUBLIC namespace is read only by tenants whose token opted in
(``public_read``) and written only with a token carrying the ``publish`` role (given
only together with ``admin``) of a tenant the operator granted publishing
(``security.publishing``); it has its own keys. Every refusal is reported to the
denial hook (the service appends it to its audit log) with the reason.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from security.errors import AccessDenied, InvalidToken
from security.keyring import PUBLIC_NAMESPACE, validate_namespace

TOKEN_VERSION = 1
_PREFIX = "akv1."
_MAX_TOKEN = 4096
_ROLES = frozenset({"tenant", "admin", "publish"})
_SUBJECT_RE = re.compile(r"[A-Za-z0-9_.@:-]{1,128}")
_CLAIMS = {"v", "ten", "sub", "roles", "pub", "iat", "exp"}


@dataclass(frozen=True, kw_only=True)
class Principal:
    tenant: str
    subject: str
    roles: frozenset[str]
    public_read: bool  # the tenant opted in to the PUBLIC namespace
    expires: float
    issued: float = 0.0  # the token's iat (a token issued before its tenant's erasure is void)

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles

    @property
    def can_publish(self) -> bool:
        """The token carries the publish scope (the tenant must also hold a live grant)."""
        return "publish" in self.roles


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


class TokenIssuer:
    """Issues and verifies HMAC-SHA256 tokens ``akv1.<claims>.<mac>``."""

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, bytes) or len(secret) < 32:
            raise ValueError("token secret must be at least 32 bytes")
        self._secret = secret

    def issue(self, tenant: str, *, subject: str, now: float, ttl_s: float = 3600.0,
              roles: Iterable[str] = ("tenant",), public_read: bool = False) -> str:
        validate_namespace(tenant)
        if tenant == PUBLIC_NAMESPACE:
            raise ValueError("no principal belongs to the PUBLIC namespace")
        roles = sorted(set(roles))
        if not roles or not set(roles) <= _ROLES or not _SUBJECT_RE.fullmatch(subject):
            raise ValueError("bad roles or subject")
        if "publish" in roles and "admin" not in roles:
            raise ValueError("the publish role is an admin scope: give it with admin")
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        claims = {"v": TOKEN_VERSION, "ten": tenant, "sub": subject, "roles": roles,
                  "pub": bool(public_read), "iat": float(now), "exp": float(now) + float(ttl_s)}
        body = _PREFIX + _b64(json.dumps(claims, sort_keys=True, separators=(",", ":")).encode())
        return body + "." + _b64(self._mac(body))

    def verify(self, token: object, now: float) -> Principal:
        """The principal of a valid, unexpired token; otherwise ``InvalidToken``."""
        if not isinstance(token, str) or len(token) > _MAX_TOKEN or not token.startswith(_PREFIX):
            raise InvalidToken("token is not an AgentKV v1 token")
        body, sep, mac_text = token.rpartition(".")
        try:
            mac = _unb64(mac_text)
        except ValueError:
            raise InvalidToken("token signature is not base64url") from None
        if not sep or not hmac.compare_digest(mac, self._mac(body)):
            raise InvalidToken("token signature does not verify")
        try:
            claims = json.loads(_unb64(body[len(_PREFIX):]))
        except ValueError:
            raise InvalidToken("token claims are not JSON") from None
        return self._principal(claims, now)

    def _principal(self, claims: object, now: float) -> Principal:
        if not isinstance(claims, dict) or set(claims) != _CLAIMS or claims["v"] != TOKEN_VERSION:
            raise InvalidToken("token claims have the wrong shape or version")
        try:
            tenant = validate_namespace(claims["ten"])
            roles = frozenset(claims["roles"])
            exp = float(claims["exp"])
            iat = float(claims["iat"])
        except (ValueError, TypeError):
            raise InvalidToken("token claims are invalid") from None
        subject = claims["sub"]
        if tenant == PUBLIC_NAMESPACE or not roles <= _ROLES or not roles or \
                ("publish" in roles and "admin" not in roles) or \
                not isinstance(subject, str) or not _SUBJECT_RE.fullmatch(subject):
            raise InvalidToken("token claims are invalid")
        if now >= exp:
            raise InvalidToken("token has expired")
        return Principal(tenant=tenant, subject=subject, roles=roles,
                         public_read=claims["pub"] is True, expires=exp, issued=iat)

    def _mac(self, body: str) -> bytes:
        return hmac.new(self._secret, body.encode(), hashlib.sha256).digest()


# Called with (principal, namespace, action, reason) on every denial (the reason is the
# text of a ``DenialReason``); the service appends it to the audit log.
DenialHook = Callable[[Principal, str, str, str], None]


class GrantCheck(Protocol):
    """Whether a tenant holds a live operator grant to publish (``security.publishing``)."""

    def allows(self, tenant: str) -> bool: ...


class DenialReason(str, enum.Enum):
    """Why an access was refused (a ``str``: the audit record carries the text)."""

    OTHER_TENANT = "another tenant's namespace"
    NO_PUBLIC_READ = "the token did not opt in to the PUBLIC namespace (public_read)"
    NO_PUBLISH_ROLE = "the token lacks the publish role"
    NO_GRANT = "the tenant holds no operator grant to publish"


NO_PUBLIC_READ = DenialReason.NO_PUBLIC_READ
NO_PUBLISH_ROLE = DenialReason.NO_PUBLISH_ROLE
NO_GRANT = DenialReason.NO_GRANT
OTHER_TENANT = DenialReason.OTHER_TENANT


class AccessPolicy:
    """Decides which namespaces a principal may read or write.

    ``grants`` is the operator's publish grants; without it nobody writes PUBLIC."""

    def __init__(self, on_denied: DenialHook | None = None,
                 grants: GrantCheck | None = None) -> None:
        self._public: set[bytes] = set()
        self._on_denied = on_denied
        self._grants = grants

    def mark_public(self, principal: Principal, identity_digest: bytes) -> None:
        """A publisher (publish role and a live grant) marks a prefix (by identity digest)
        shareable through PUBLIC."""
        self.check(principal, PUBLIC_NAMESPACE, "write")
        if not isinstance(identity_digest, bytes) or len(identity_digest) != 32:
            raise ValueError("identity digest must be 32 bytes")
        self._public.add(identity_digest)

    def is_public(self, identity_digest: bytes) -> bool:
        return identity_digest in self._public

    def check(self, principal: Principal, namespace: str, action: str) -> None:
        """Raise ``AccessDenied`` (and report it) unless ``principal`` may do ``action`` there."""
        if action not in ("read", "write"):
            raise ValueError(f"unknown action {action!r:.20}")
        if namespace == principal.tenant:
            return
        reason = self._public_refusal(principal, action) if namespace == PUBLIC_NAMESPACE \
            else OTHER_TENANT
        if reason is None:
            return
        if self._on_denied is not None:
            self._on_denied(principal, namespace, action, reason.value)
        raise AccessDenied(f"{principal.subject} may not {action} namespace {namespace!r:.70}: "
                           f"{reason.value}")

    def _public_refusal(self, principal: Principal, action: str) -> DenialReason | None:
        """Why ``principal`` may not do ``action`` in PUBLIC (None if it may)."""
        if action == "read":
            return None if principal.public_read else NO_PUBLIC_READ
        if not principal.can_publish:
            return NO_PUBLISH_ROLE
        if self._grants is None or not self._grants.allows(principal.tenant):
            return NO_GRANT
        return None

    def may_load_public(self, principal: Principal) -> bool:
        """Whether ``principal`` may load the PUBLIC pages in its session (a session is its
        tenant's, not its token's): with the opt-in (``public_read``) only. The publish
        role is not enough: a store into PUBLIC keeps the copy already there (the first),
        so a publisher's session can hold pages another tenant wrote."""
        return self._public_refusal(principal, "read") is None

    def lookup_namespaces(self, principal: Principal, identity_digest: bytes) -> tuple[str, ...]:
        """Where a lookup of this prefix may look, own namespace first."""
        if principal.public_read and identity_digest in self._public:
            return (principal.tenant, PUBLIC_NAMESPACE)
        return (principal.tenant,)
