"""A page named in a request, as the controller knows it: its ``PageMeta``.

The namespace comes from the page's identity and must be one the principal may use for
the action (``security.principals.AccessPolicy``: another tenant's is refused and the
denial audited; PUBLIC is provisioned on its first use); the directory key is the
identity's digest blinded under that namespace, so nothing else can match it.
"""

from __future__ import annotations

from typing import Any

from agentkv_cluster.api.errors import AccessDenied, NotFound
from agentkv_cluster.lifecycle.identity import PageIdentity
from agentkv_cluster.runtime.records import PageMeta
from agentkv_cluster.runtime.request_args import page_fields, page_identity
from agentkv_cluster.runtime.tenants import ensure_tenant
from security.blinding import DirectoryBlinder
from security.errors import AccessDenied as SecurityDenied
from security.errors import KeyUnavailable
from security.keyring import PUBLIC_NAMESPACE
from security.principals import AccessPolicy, Principal


class PageNaming:
    """Request pages -> ``PageMeta`` for the API front (thread-safe as its parts are)."""

    def __init__(self, access: AccessPolicy, blinder: DirectoryBlinder, keys_dir: str) -> None:
        self.access = access
        self.blinder = blinder
        self.keys_dir = keys_dir

    def meta(self, principal: Principal, session: str, page: dict[str, Any], action: str,
             length: int) -> PageMeta:
        """The page of ``length`` bytes that ``principal`` names in ``session`` for
        ``action`` ("read" or "write"); raises ``InvalidArgument`` (bad fields),
        ``AccessDenied`` (a namespace it may not use) or ``NotFound`` (no keys yet)."""
        identity = page_identity(page)
        ns = self._namespace(principal, identity, action)  # before the rest: denials audited
        fields = page_fields(page, length, identity)
        digest = identity.digest()
        try:
            key = self.blinder.blind_key(ns, digest)
        except KeyUnavailable:  # no keys yet: this tenant never opened a session here
            raise NotFound("session is not open") from None
        return PageMeta(key=key, digest=digest, tenant=principal.tenant, namespace=ns,
                        session=session, page_id=fields.page_id, state_type=fields.state_type,
                        length=length, tokens=identity.end - identity.start,
                        shape=fields.shape, structured=fields.structured)

    def check(self, principal: Principal, namespace: str, action: str) -> None:
        """``AccessDenied`` unless ``principal`` may ``action`` in ``namespace`` (another
        tenant's, PUBLIC without the opt-in or grant): the denial is audited."""
        try:
            self.access.check(principal, namespace, action)
        except SecurityDenied as exc:
            raise AccessDenied(str(exc)) from None

    def _namespace(self, principal: Principal, identity: PageIdentity, action: str) -> str:
        ns = identity.tenant
        self.check(principal, ns, action)
        if ns == PUBLIC_NAMESPACE:
            ensure_tenant(self.keys_dir, PUBLIC_NAMESPACE)
        return ns
