"""Erasure receipts: signing, offline verification, tampering and malformed input (acceptance 6, 9)."""

from __future__ import annotations

import json

import pytest

from security.audit import AuditLog, verify_log
from security.erasure import Eraser, EraseScope, verify_receipt
from security.errors import InvalidReceipt, InvalidSeal
from security.signing import Signer, Verifier, fingerprint

DIGEST = b"z" * 32


@pytest.fixture
def eraser(tmp_path, keyring, signer):
    audit = AuditLog(tmp_path / "audit.log", signer, checkpoint_every=1)
    eraser = Eraser(keyring, audit, signer)
    yield eraser
    audit.close()


def test_erase_tenant_receipt(eraser, keyring, sealer, signer, tmp_path):
    sealed = bytes(sealer.seal("alice", DIGEST, 1, 1, 1, b"page"))
    calls = []
    eraser.register_tier("host", lambda scope: calls.append(scope) or 3)
    eraser.register_tier("nvme", lambda scope: 5)
    receipt = eraser.erase_tenant("alice", now=1234.5)
    assert calls == [EraseScope(tenant="alice", generation=None)]
    assert (receipt.tenant, receipt.scope, receipt.generation) == ("alice", "tenant", None)
    assert receipt.counts == (("host", 3), ("nvme", 5)) and receipt.failed_tiers == ()
    assert [k.split("/")[1] for k in receipt.key_ids] == ["g1", "blind"]
    assert receipt.time == 1234.5
    assert keyring.erased_at("alice") == 1234.5  # tokens issued until then are void
    verifier = Verifier(signer.public_raw())
    assert verify_receipt(receipt.to_json(), verifier) == receipt
    assert verify_log(tmp_path / "audit.log", verifier, anchors=[receipt.audit_position()]).ok
    with pytest.raises(InvalidSeal):
        sealer.open("alice", DIGEST, 1, 1, 1, sealed)
    bob = bytes(sealer.seal("bob", DIGEST, 1, 1, 1, b"bob page"))
    assert bytes(sealer.open("bob", DIGEST, 1, 1, 1, bob)) == b"bob page"  # others untouched


def test_erase_generation_keeps_the_other_generations(eraser, keyring, sealer):
    keyring.rotate("alice")
    g1 = bytes(sealer.seal("alice", DIGEST, 1, 1, 1, b"one"))
    g2 = bytes(sealer.seal("alice", DIGEST, 2, 1, 1, b"two"))
    receipt = eraser.erase_generation("alice", 1, now=5.0)
    assert receipt.scope == "generation" and receipt.generation == 1 and len(receipt.key_ids) == 1
    assert bytes(sealer.open("alice", DIGEST, 2, 1, 1, g2)) == b"two"
    with pytest.raises(InvalidSeal):
        sealer.open("alice", DIGEST, 1, 1, 1, g1)


def test_a_failing_tier_is_recorded_and_keys_are_still_gone(eraser, keyring):
    def broken(scope):
        raise OSError("disk gone")

    eraser.register_tier("nvme", broken)
    receipt = eraser.erase_tenant("alice", now=1.0)
    assert receipt.counts == (("nvme", -1),) and receipt.failed_tiers == ("nvme",)
    assert keyring.generations("alice") == []


@pytest.mark.parametrize("field", ["tenant", "scope", "generation", "key_ids", "counts", "time",
                                   "audit_seq", "audit_hash", "failed_tiers", "signature"])
def test_tampered_receipt_fails(eraser, signer, field):
    eraser.register_tier("host", lambda scope: 2)
    receipt = json.loads(eraser.erase_tenant("alice", now=9.0).to_json())
    receipt[field] = {"tenant": "bob", "scope": "generation", "generation": 1,
                      "key_ids": ["alice/g9/0000000000000000"], "counts": [["host", 0]],
                      "time": 10.0, "audit_seq": 5, "audit_hash": "0" * 64,
                      "failed_tiers": ["host"], "signature": "00" * 64}[field]
    with pytest.raises(InvalidReceipt, match="does not verify"):
        verify_receipt(json.dumps(receipt), Verifier(signer.public_raw()))


def test_receipt_from_another_signer_fails_naming_both_keys(eraser, signer):
    text = eraser.erase_tenant("alice", now=9.0).to_json()
    other = Signer.generate()
    with pytest.raises(InvalidReceipt, match="different key") as failed:
        verify_receipt(text, Verifier(other.public_raw()))
    mine, theirs = fingerprint(signer.public_raw()), fingerprint(other.public_raw())
    assert str(failed.value) == (f"receipt was signed by a different key (receipt signer "
                                 f"{mine}, public key {theirs})")


def _malformed(good: dict) -> list[tuple[object, str]]:
    drop = dict(good)
    drop.pop("time")
    return [
        (b"", "not JSON"), (b"{", "not JSON"), (b"[]", "exactly the fields"),
        (json.dumps(drop), "exactly the fields"), (json.dumps({**good, "extra": 1}), "exactly the fields"),
        (json.dumps({**good, "version": 2}), "unknown receipt version"),
        (json.dumps({**good, "scope": "planet"}), "unknown receipt version or scope"),
        (json.dumps({**good, "audit_seq": "7"}), "wrong type"),
        (json.dumps({**good, "audit_seq": True}), "wrong type"),
        (json.dumps({**good, "key_ids": "abc"}), "wrong type"),
        (json.dumps({**good, "counts": [["host"]]}), "pairs"),
        (json.dumps({**good, "counts": [[1, 2]]}), "wrong type"),
        (json.dumps({**good, "signature": "zz"}), "not hex"),
        ("x" * 70_000, "larger than 64 KiB"),
        ("[" * 30_000 + "]" * 30_000, "not JSON"),  # nested past the parser's stack
    ]


def test_malformed_receipts_give_clean_errors(eraser, signer):
    good = json.loads(eraser.erase_tenant("alice", now=9.0).to_json())
    for text, match in _malformed(good):
        with pytest.raises(InvalidReceipt, match=match):
            verify_receipt(text, Verifier(signer.public_raw()))


def test_register_tier_validates(eraser):
    eraser.register_tier("host", lambda s: 0)
    for name in ("host", "Bad", "", "x" * 40):
        with pytest.raises(ValueError):
            eraser.register_tier(name, lambda s: 0)


def test_unknown_tenant_or_generation(eraser):
    with pytest.raises(Exception, match="no keys"):
        eraser.erase_tenant("carol", now=1.0)
    with pytest.raises(Exception, match="does not exist"):
        eraser.erase_generation("alice", 7, now=1.0)
