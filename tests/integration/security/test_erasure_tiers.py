"""Acceptance 6: after ``tenant erase`` no tier can decrypt the tenant's pages, the receipt
verifies offline with only the public key (through the CLI), and a tampered receipt fails."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from agentkv_cluster.cli import main
from agentkv_cluster.lifecycle.identity import PageIdentity
from security.audit import AuditLog
from security.erasure import Eraser
from security.errors import InvalidSeal
from security.keyring import FileKeySource, TenantKeyring
from security.sealing import TenantSealer
from security.signing import write_keypair
from store.types import Lookup, Tier
from tests.integration.security.conftest import NOW

pytestmark = pytest.mark.integration

BASE = PageIdentity(model_version="m", adapter_version="", tokenizer_version="t", rope_config="r",
                    tenant="acme", session="s", start=0, end=64, event_version=1)


def _directory_deleter(cache, namespace):
    def delete(scope) -> int:
        keys = list(cache.admin.scan_iter(match=f"akv:{{{namespace}}}:*"))
        return cache.admin.delete(*keys) if keys else 0
    return delete


def test_erase_tenant_in_every_tier(cache, tokens, tmp_path, capsys):
    signer = write_keypair(tmp_path / "audit.pem", tmp_path / "audit.pub")
    stored = []  # (tier, slot, digest, generation, sealed bytes as they sat in the tier)
    cache.keyring.rotate("acme")  # pages under two generations
    for i, tier in enumerate([*Tier, *Tier]):
        digest = dataclasses.replace(BASE, session=f"s{i}").digest()
        if i == 3:
            cache.keyring.rotate("acme")
        slot = cache.put(tokens["acme"], digest, tier, os.urandom(3000), NOW)
        stored.append((tier, slot, digest, cache.keyring.current_generation("acme"),
                       cache.tiers.read(tier, slot)))
        cache.put(tokens["globex"], digest, tier, b"globex page %d" % i, NOW)
    audit = AuditLog(tmp_path / "audit.log", signer, checkpoint_every=1)
    eraser = Eraser(cache.keyring, audit, signer)
    for tier in Tier:
        eraser.register_tier(tier.name.lower(), cache.tier_deleter(tier))
    acme_ns = cache.blinder.namespace("acme")
    eraser.register_tier("directory", _directory_deleter(cache, acme_ns))
    receipt = eraser.erase_tenant("acme", now=NOW + 60)
    audit.close(now=NOW + 60)

    assert dict(receipt.counts) == {"hbm": 2, "host": 2, "nvme": 2, "directory": 6}
    assert len(receipt.key_ids) == 4  # three generations and the blinding secret
    # Nothing decrypts: not with this process's keyring, not with a fresh one on the key directory,
    # not even the copies taken from each tier before erasure.
    fresh = TenantSealer(TenantKeyring(FileKeySource(tmp_path / "keys")))
    for tier, slot, digest, generation, sealed in stored:
        assert cache.tiers.read(tier, slot) is None
        assert sealed not in cache.tiers.raw_bytes()
        for sealer in (cache.sealer, fresh):
            with pytest.raises(InvalidSeal):
                sealer.open("acme", digest, generation, tier, slot, sealed)
    # acme keeps only its (empty) erasure marks: the time, and the directory namespace
    left = sorted(os.listdir(tmp_path / "keys"))
    assert left[2:] == ["globex.blind.key", "globex.g00000001.kek"]
    assert left[0] == f"acme.dirns.{acme_ns}" and left[1].startswith("acme.erased.")
    assert all(os.path.getsize(tmp_path / "keys" / name) == 0 for name in left[:2])
    for i in range(6):  # the other tenant is untouched
        digest = dataclasses.replace(BASE, session=f"s{i}").digest()
        assert cache.lookup(tokens["globex"], digest, NOW) == (Lookup.HIT, b"globex page %d" % i)

    # Offline: only the receipt, the log and the public key file.
    path = tmp_path / "receipt.json"
    path.write_text(receipt.to_json())
    capsys.readouterr()
    assert main(["audit", "receipt", str(path), "--public-key", str(tmp_path / "audit.pub"),
                 "--log", str(tmp_path / "audit.log")]) == 0
    assert "PASS erasure of tenant acme" in capsys.readouterr().out
    tampered = json.loads(path.read_text())
    tampered["counts"] = [["hbm", 2], ["host", 2], ["nvme", 2], ["directory", 7]]
    path.write_text(json.dumps(tampered))
    assert main(["audit", "receipt", str(path), "--public-key", str(tmp_path / "audit.pub")]) == 1
    assert "does not verify" in capsys.readouterr().out
