"""Tokens, principals and namespace access (acceptance 9 for tokens)."""

from __future__ import annotations

import base64
import json

import pytest

from security.errors import AccessDenied, InvalidToken
from security.keyring import PUBLIC_NAMESPACE
from security.principals import NO_GRANT, NO_PUBLISH_ROLE, AccessPolicy, TokenIssuer

SECRET = b"s" * 32
NOW = 1_000.0
PREFIX_DIGEST = b"p" * 32


@pytest.fixture
def issuer() -> TokenIssuer:
    return TokenIssuer(SECRET)


def test_round_trip(issuer):
    token = issuer.issue("acme", subject="svc-1", now=NOW, ttl_s=60, public_read=True)
    p = issuer.verify(token, NOW + 59)
    assert (p.tenant, p.subject, p.roles, p.public_read, p.expires, p.issued) == (
        "acme", "svc-1", frozenset({"tenant"}), True, NOW + 60, NOW)
    assert not p.is_admin


def _forge(token: str, **changes) -> str:
    body, mac = token.rsplit(".", 1)
    claims = json.loads(base64.urlsafe_b64decode(body[5:] + "=="))
    claims.update(changes)
    raw = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"akv1.{raw}.{mac}"


def _malformed(issuer) -> list[tuple[str, object, str]]:
    good = issuer.issue("acme", subject="svc", now=NOW)
    other = TokenIssuer(b"o" * 32).issue("acme", subject="svc", now=NOW)
    return [
        ("not a string", 12345, "not an AgentKV"),
        ("empty", "", "not an AgentKV"),
        ("no prefix", good[5:], "not an AgentKV"),
        ("huge", "akv1." + "a" * 5000, "not an AgentKV"),
        ("no signature", good.rsplit(".", 1)[0], "does not verify"),
        ("signature not base64", good.rsplit(".", 1)[0] + ".@@@", "not base64url"),
        ("other secret", other, "does not verify"),
        ("tenant swapped", _forge(good, ten="victim"), "does not verify"),
        ("role raised", _forge(good, roles=["admin"]), "does not verify"),
        ("truncated", good[:-3], "does not verify"),
        ("expired", good, "expired"),
    ]


def test_malformed_tokens_give_clean_errors(issuer):
    for label, token, match in _malformed(issuer):
        with pytest.raises(InvalidToken, match=match):
            issuer.verify(token, NOW + 3600 if label == "expired" else NOW)


def test_validly_signed_but_bad_claims_are_rejected():
    import hashlib
    import hmac

    def sign(claims) -> str:
        body = "akv1." + base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
        mac = hmac.new(SECRET, body.encode(), hashlib.sha256).digest()
        return body + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    base = {"v": 1, "ten": "acme", "sub": "svc", "roles": ["tenant"], "pub": False,
            "iat": NOW, "exp": NOW + 10}
    bad = [dict(base, v=2), dict(base, ten="_public"), dict(base, ten="Bad Name"),
           dict(base, roles=["root"]), dict(base, roles=[]), dict(base, roles="admin"),
           dict(base, sub=["x"]), dict(base, exp="soon"), {k: v for k, v in base.items() if k != "pub"},
           dict(base, extra=1), [1, 2]]
    for claims in bad:
        with pytest.raises(InvalidToken):
            TokenIssuer(SECRET).verify(sign(claims), NOW)
    assert TokenIssuer(SECRET).verify(sign(base), NOW).tenant == "acme"


def test_issue_rejects_bad_input(issuer):
    with pytest.raises(ValueError):
        issuer.issue(PUBLIC_NAMESPACE, subject="svc", now=NOW)
    with pytest.raises(ValueError):
        issuer.issue("acme", subject="svc", now=NOW, roles=["root"])
    with pytest.raises(ValueError):
        TokenIssuer(b"short")


def test_access_policy_own_namespace_only_and_denials_reported(issuer):
    denials = []
    policy = AccessPolicy(on_denied=lambda p, ns, action, why: denials.append((p.tenant, ns,
                                                                                action)))
    acme = issuer.verify(issuer.issue("acme", subject="a", now=NOW), NOW)
    policy.check(acme, "acme", "read")
    policy.check(acme, "acme", "write")
    for ns, action in (("globex", "read"), ("globex", "write"), (PUBLIC_NAMESPACE, "read"),
                       (PUBLIC_NAMESPACE, "write")):
        with pytest.raises(AccessDenied):
            policy.check(acme, ns, action)
    assert denials == [("acme", "globex", "read"), ("acme", "globex", "write"),
                       ("acme", PUBLIC_NAMESPACE, "read"), ("acme", PUBLIC_NAMESPACE, "write")]


def test_public_namespace_is_opt_in_and_publisher_marked(issuer):
    policy = AccessPolicy(grants=_Granted({"ops"}))
    admin = issuer.verify(issuer.issue("ops", subject="root", now=NOW,
                                       roles=["admin", "publish"]), NOW)
    opted = issuer.verify(issuer.issue("acme", subject="a", now=NOW, public_read=True), NOW)
    plain = issuer.verify(issuer.issue("globex", subject="g", now=NOW), NOW)
    with pytest.raises(AccessDenied):
        policy.mark_public(opted, PREFIX_DIGEST)
    assert policy.lookup_namespaces(opted, PREFIX_DIGEST) == ("acme",)
    policy.mark_public(admin, PREFIX_DIGEST)
    assert policy.lookup_namespaces(opted, PREFIX_DIGEST) == ("acme", PUBLIC_NAMESPACE)
    assert policy.lookup_namespaces(plain, PREFIX_DIGEST) == ("globex",)
    assert policy.lookup_namespaces(opted, b"q" * 32) == ("acme",)
    policy.check(opted, PUBLIC_NAMESPACE, "read")
    with pytest.raises(AccessDenied):
        policy.check(opted, PUBLIC_NAMESPACE, "write")
    # loading PUBLIC pages in a session goes by token: opted in only (a publisher's
    # store of an identity held already keeps the first copy, which it did not write)
    assert policy.may_load_public(opted)
    assert not policy.may_load_public(admin) and not policy.may_load_public(plain)
    both = issuer.verify(issuer.issue("ops", subject="root", now=NOW, public_read=True,
                                      roles=["admin", "publish"]), NOW)
    assert policy.may_load_public(both)


class _Granted:
    """The operator's grants as a plain set (``security.publishing`` has the real ones)."""

    def __init__(self, tenants: set[str]) -> None:
        self.tenants = tenants

    def allows(self, tenant: str) -> bool:
        return tenant in self.tenants


def test_the_publish_role_comes_only_with_admin(issuer):
    with pytest.raises(ValueError, match="admin"):
        issuer.issue("acme", subject="a", now=NOW, roles=["tenant", "publish"])
    p = issuer.verify(issuer.issue("acme", subject="a", now=NOW, roles=["admin", "publish"]), NOW)
    assert p.can_publish and p.is_admin
    assert not issuer.verify(issuer.issue("acme", subject="a", now=NOW, roles=["admin"]),
                             NOW).can_publish
    # A token carrying publish without admin (a forged or foreign issuer's shape) is refused.
    claims = {"v": 1, "ten": "acme", "sub": "a", "roles": ["publish"], "pub": False,
              "iat": NOW, "exp": NOW + 60}
    with pytest.raises(InvalidToken, match="invalid"):
        issuer._principal(claims, NOW)


def test_public_writes_need_the_publish_role_and_a_live_grant(issuer):
    """An admin token alone publishes nothing; neither does a publish token of a tenant
    without the operator's grant; each refusal reaches the hook with its reason."""
    denials = []
    grants = _Granted({"ops"})
    policy = AccessPolicy(on_denied=lambda p, ns, action, why: denials.append((p.tenant, why)),
                          grants=grants)

    def principal(tenant, roles):
        return issuer.verify(issuer.issue(tenant, subject="s", now=NOW, roles=roles), NOW)

    admin_only = principal("ops", ["admin"])
    ungranted = principal("acme", ["admin", "publish"])
    publisher = principal("ops", ["admin", "publish"])
    for who in (admin_only, ungranted):
        with pytest.raises(AccessDenied):
            policy.check(who, PUBLIC_NAMESPACE, "write")
    policy.check(publisher, PUBLIC_NAMESPACE, "write")
    grants.tenants.clear()  # revoked
    with pytest.raises(AccessDenied, match="grant"):
        policy.check(publisher, PUBLIC_NAMESPACE, "write")
    with pytest.raises(AccessDenied):  # no grant registry at all: nobody publishes
        AccessPolicy().check(publisher, PUBLIC_NAMESPACE, "write")
    assert denials == [("ops", NO_PUBLISH_ROLE), ("acme", NO_GRANT), ("ops", NO_GRANT)]
