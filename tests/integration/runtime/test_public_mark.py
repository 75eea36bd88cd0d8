"""Publishing into PUBLIC on a running service (real front over TCP, controller, HBM actor,
host pool, NVMe shard, key directory, audit log): it needs a token with the ``publish``
role AND the operator's grant (``agentkv tenant publish``); readers must have opted in;
a revocation or an erasure of the publisher ends it; every refusal is in the audit log,
with its reason, and the log verifies."""

from __future__ import annotations

import json
import time

import pytest

from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.cli import main
from agentkv_cluster.runtime.service import Service
from security.audit import verify_log
from security.keyring import PUBLIC_NAMESPACE
from security.principals import NO_GRANT, NO_PUBLIC_READ, NO_PUBLISH_ROLE
from security.signing import load_verifier
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration

PAGE = 2 * 2 * 2 * 128 * 64 * 2  # kv_page's size
PUBLISHER = ("tenant", "admin", "publish")


@pytest.fixture(scope="module")
def service():
    with local_service("agentkv-public-", page_bytes=PAGE, hbm_pages=16,
                       pool_bytes=8 * PAGE) as svc:
        yield svc


def _cli(service: Service, *args: str) -> int:
    return main(["tenant", *args, "--keys-dir", service.keys_dir,
                 "--audit-log", str(service.workdir / "audit.log"),
                 "--signing-key", str(service.workdir / "audit.key")])


def _records(service: Service, kind: str) -> list[dict]:
    lines = (service.workdir / "audit.log").read_text().splitlines()
    return [r["data"] for r in map(json.loads, lines) if r["kind"] == kind]


def _denied(service: Service) -> list[tuple[str, str, str, str]]:
    return [(d["tenant"], d["namespace"], d["action"], d["reason"])
            for d in _records(service, "access.denied")]


def _public_page(session: str, start: int) -> dict:
    return kv_page(start, "fixed_prefix", identity(PUBLIC_NAMESPACE, session, start))


def _store_eventually(s, page: dict, ok: bool, within_s: float = 5.0) -> None:
    """Store ``page`` until it succeeds (``ok``) or is refused (not ``ok``): grants and
    revocations reach the front within its re-read interval (1 s)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            s.store_pages([page])
            if ok:
                return
        except RemoteError as exc:
            assert exc.code == "forbidden", exc
            if not ok:
                return
        assert time.monotonic() < deadline, f"the grant change did not show within {within_s} s"
        time.sleep(0.2)


def _published(service: Service, publisher: str, topic: str) -> tuple[dict, bytes]:
    """A PUBLIC page of ``topic`` that ``publisher`` (created and granted here) stored
    from a session it then left; the page and its packed identity."""
    page = _public_page(topic, 0)
    assert _cli(service, "create", publisher) == 0
    assert _cli(service, "publish", publisher) == 0
    with service.client(publisher, roles=PUBLISHER) as pub:
        _store_eventually(pub.open_session(f"{publisher}-1"), page, ok=True)
    return page, identity(PUBLIC_NAMESPACE, topic, 0).pack()


def test_an_admin_token_cannot_publish_even_for_a_granted_tenant(service) -> None:
    assert _cli(service, "create", "acme") == 0
    assert _cli(service, "publish", "acme") == 0  # the grant is there; the role is not
    before = len(_denied(service))
    with service.client("acme", roles=("tenant", "admin")) as admin, \
            service.client("globex") as plain:
        s = admin.open_session("a1")
        assert s.opened["publish"] is False
        time.sleep(1.1)  # past the front's grant re-read: only the role is missing
        with pytest.raises(RemoteError) as err:
            s.store_pages([_public_page("schemas", 0)])
        assert err.value.code == "forbidden"
        g = plain.open_session("g1")
        with pytest.raises(RemoteError) as err:
            g.store_pages([_public_page("schemas", 0)])
        assert err.value.code == "forbidden"
        own = kv_page(1, "evidence", identity("acme", "a1", 0))
        assert len(s.store_pages([own])) == 1  # its own namespace, as before
    with service.client("umbrella", public_read=True) as reader:
        r = reader.open_session("r1")
        assert r.lookup_prefix([identity(PUBLIC_NAMESPACE, "schemas", 0).pack()])["length"] == 0
    assert _denied(service)[before:] == [
        ("acme", PUBLIC_NAMESPACE, "write", NO_PUBLISH_ROLE),
        ("globex", PUBLIC_NAMESPACE, "write", NO_PUBLISH_ROLE)]


def test_a_granted_publisher_shares_with_opted_in_readers_until_revoked(service) -> None:
    page = _public_page("tools", 0)
    ident = identity(PUBLIC_NAMESPACE, "tools", 0).pack()
    before = len(_denied(service))
    with service.client("initech", roles=PUBLISHER) as pub:
        s = pub.open_session("p1")
        assert s.opened["publish"] is False
        with pytest.raises(RemoteError) as err:  # the publish role without the grant
            s.store_pages([page])
        assert err.value.code == "forbidden"
        assert _denied(service)[before:] == [("initech", PUBLIC_NAMESPACE, "write", NO_GRANT)]
        assert _cli(service, "publish", "initech") == 0
        assert _records(service, "publish.grant")[-1]["tenant"] == "initech"
        _store_eventually(s, page, ok=True)
        assert pub.open_session("p2").opened["publish"] is True

        with service.client("umbrella", public_read=True) as reader:
            r = reader.open_session("r2")
            found = r.lookup_prefix([ident])
            assert found["length"] == 1
            assert r.load(found["keys"]) == [page["data"]]
        with service.client("hooli") as stranger:  # never opted in
            h = stranger.open_session("h1")
            got = h.lookup_prefix([ident])
            assert got["length"] == 0 and got["refused"].startswith("AccessDenied")
        assert ("hooli", PUBLIC_NAMESPACE, "read", NO_PUBLIC_READ) in _denied(service)

        assert _cli(service, "publish", "initech", "--revoke") == 0
        assert _records(service, "publish.revoke")[-1] == {"tenant": "initech", "entries": 1}
        _store_eventually(s, _public_page("tools", 128), ok=False)
    assert _denied(service)[-1] == ("initech", PUBLIC_NAMESPACE, "write", NO_GRANT)
    report = verify_log(service.workdir / "audit.log", load_verifier(service.workdir / "audit.pub"))
    assert report.ok, report.problems


def test_erasing_a_publisher_takes_its_grant(service, capsys) -> None:
    assert _cli(service, "create", "wayne") == 0
    assert _cli(service, "publish", "wayne") == 0
    with service.client("wayne", roles=PUBLISHER) as pub:
        s = pub.open_session("w1")
        _store_eventually(s, _public_page("docs", 0), ok=True)
    receipt = service.erase_tenant("wayne")
    assert not receipt.failed_tiers
    capsys.readouterr()
    assert main(["tenant", "publishers", "--keys-dir", service.keys_dir]) == 0
    assert "wayne" not in capsys.readouterr().out
    with service.client("wayne", roles=PUBLISHER) as again:  # issued after the erasure
        s = again.open_session("w2")
        assert s.opened["publish"] is False
        with pytest.raises(RemoteError) as err:
            s.store_pages([_public_page("docs", 128)])
        assert err.value.code == "forbidden"
    assert _denied(service)[-1] == ("wayne", PUBLIC_NAMESPACE, "write", NO_GRANT)


def test_the_cli_issues_publish_tokens_only_with_admin(tmp_path, capsys) -> None:
    from security.principals import TokenIssuer

    secret = tmp_path / "token.secret"
    secret.write_bytes(b"k" * 40)
    issuer = TokenIssuer(b"k" * 40)
    capsys.readouterr()
    assert main(["tenant", "token", "acme", "--publish", "--token-secret-file", str(secret)]) == 0
    principal = issuer.verify(capsys.readouterr().out.strip(), time.time())
    assert principal.roles == frozenset({"tenant", "admin", "publish"})
    assert main(["tenant", "token", "acme", "--token-secret-file", str(secret)]) == 0
    assert issuer.verify(capsys.readouterr().out.strip(), time.time()).roles == {"tenant"}


def test_a_grant_names_a_tenant_that_exists(service, capsys) -> None:
    """A grant to a name without keys (a typo, or a tenant erased) is refused and recorded
    nowhere: it would have been live for whoever was created under that name later."""
    grants = len(_records(service, "publish.grant"))
    capsys.readouterr()
    assert _cli(service, "publish", "acmee") == 2
    err = capsys.readouterr().err
    assert "tenant 'acmee' has no keys" in err and "agentkv tenant create acmee" in err
    assert len(_records(service, "publish.grant")) == grants
    assert main(["tenant", "publishers", "--keys-dir", service.keys_dir]) == 0
    assert "acmee" not in capsys.readouterr().out
    assert _cli(service, "publish", "acmee", "--revoke") == 0  # revoking is always allowed



def _refused_event(s, kind: str, **fields) -> None:
    with pytest.raises(RemoteError) as err:
        s.event(kind, **fields)
    assert err.value.code == "bad_args" and "PUBLIC namespace" in str(err.value), err.value


def test_a_reader_cannot_retire_a_public_page_for_the_other_readers(service) -> None:
    """A reader (``public_read``, no right to publish) cannot name a PUBLIC page it looked up
    in its events (found from outside: as its task's input, its task end deleted PUBLIC's
    copy and directory entry, so any opted-in tenant could wipe what a publisher shared)."""
    page, ident = _published(service, "tyrell", "schemas")
    # What it published stays in PUBLIC; no session of the publisher holds it any more.
    assert not service.erase_tenant("tyrell").failed_tiers
    with service.client("mallory", public_read=True) as reader:
        m = reader.open_session("m1")
        assert m.lookup_prefix([ident])["length"] == 1
        _refused_event(m, "task_start", event_id=1, task_id="t", version=1, ts=0.0,
                       prefix_generation=1, input_pages=[0])
        m.task_start(event_id=2, task_id="t", version=2, ts=0.0, prefix_generation=1)
        m.task_end(event_id=3, task_id="t", version=3, ts=0.1)
    time.sleep(0.5)  # a retirement's deletions run in the background
    with service.client("acme", public_read=True) as other:
        s = other.open_session("a1")
        found = s.lookup_prefix([ident])
        assert found["length"] == 1
        assert s.load(found["keys"]) == [page["data"]]


def test_a_reader_cannot_retype_a_public_page_or_retire_it_in_the_publishers_name(service
                                                                                   ) -> None:
    """Nor can it claim a PUBLIC page its publisher still holds as its own draft, verify it
    and end its task: that retyped the publisher's page for the policy and left a signed
    ``page_retired`` record naming the publisher's tenant and session for a page that was
    never retired (found from outside)."""
    page = kv_page(0, "tool_observation", identity(PUBLIC_NAMESPACE, "manuals", 0))
    assert _cli(service, "create", "cyberdyne") == 0
    assert _cli(service, "publish", "cyberdyne") == 0
    with service.client("cyberdyne", roles=PUBLISHER, public_read=True) as pub, \
            service.client("mallory", public_read=True) as reader:
        p = pub.open_session("c1")
        _store_eventually(p, page, ok=True)
        m = reader.open_session("m2")
        assert m.lookup_prefix([page["identity"]])["length"] == 1
        m.task_start(event_id=1, task_id="t", version=1, ts=0.0, prefix_generation=1)
        _refused_event(m, "model_call", event_id=2, task_id="t", version=2, ts=0.1,
                       call_id="c1", produces=[[0, "temp_reasoning"]])
        _refused_event(m, "verification_pass", event_id=3, task_id="t", version=3, ts=0.2,
                       call_id="v1", pages=[0])
        m.task_end(event_id=4, task_id="t", version=4, ts=0.3)
        service.drain_audit()
        assert not [r for r in _records(service, "page_retired") if r["tenant"] == "cyberdyne"]
        assert p.load(p.store_pages([page])) == [page["data"]]


def test_a_token_without_the_opt_in_cannot_load_a_public_page_its_tenant_adopted(service
                                                                                ) -> None:
    """A session is its tenant's, not its token's: a PUBLIC page that an opted-in token
    looked up (adopting it into the session) could be loaded there, by its key, with a
    token of the same tenant that never opted in (found from outside). The opt-in is the
    token's, so the load checks it too; the refusal is audited like a lookup's."""
    page, ident = _published(service, "soylent", "handbooks")
    before = len(_denied(service))
    with service.client("vandelay", public_read=True) as reader, \
            service.client("vandelay") as plain:
        found = reader.open_session("shared").lookup_prefix([ident])
        assert found["length"] == 1
        same_session = plain.open_session("shared")
        with pytest.raises(RemoteError) as err:
            same_session.load(found["keys"])
        assert err.value.code == "forbidden" and "PUBLIC" in str(err.value)
        assert _denied(service)[before:] == [
            ("vandelay", PUBLIC_NAMESPACE, "read", NO_PUBLIC_READ)]
        own = kv_page(1, "evidence", identity("vandelay", "shared", 0))
        assert same_session.load(same_session.store_pages([own])) == [own["data"]]
        assert reader.open_session("shared").load(found["keys"]) == [page["data"]]


def test_a_publisher_without_the_opt_in_cannot_read_public_pages_by_storing_them(service
                                                                                ) -> None:
    """A store of an identity PUBLIC holds already keeps the first copy (the caller's bytes
    are dropped) and puts it in the session: with the publish role alone that copy could
    then be loaded, another publisher's bytes read by a token that never opted in, and
    compared with its own to learn whether the prefix was published (found from outside).
    Loading PUBLIC pages needs the opt-in, whoever stored them."""
    page, _ = _published(service, "tyrell", "private-schema")
    assert _cli(service, "create", "nakatomi") == 0
    assert _cli(service, "publish", "nakatomi") == 0
    junk = dict(page, data=bytes(len(page["data"])))  # its own bytes, same identity
    with service.client("nakatomi", roles=PUBLISHER) as pub:
        s = pub.open_session("g1")
        time.sleep(1.1)  # past the front's grant re-read
        keys = s.store_pages([junk])
        with pytest.raises(RemoteError) as err:
            s.load(keys)
        assert err.value.code == "forbidden"
    with service.client("nakatomi", roles=PUBLISHER, public_read=True) as reader:
        assert reader.open_session("g1").load(keys) == [page["data"]]  # the first copy
