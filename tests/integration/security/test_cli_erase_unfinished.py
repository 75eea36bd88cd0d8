"""An erasure whose receipt a full disk refused, seen and finished from the admin CLI: `audit
verify` lists it, `tenant erase` run again finishes it (a real tmpfs, a real redis-server)."""

from __future__ import annotations

import json

import pytest
import redis

from agentkv_cluster.cli import main
from security.audit import AuditLog
from security.blinding import DirectoryBlinder
from security.erasure import Eraser
from security.errors import ErasureUnrecorded
from security.keyring import FileKeySource, TenantKeyring
from security.signing import load_signer
from tests.support.tmpfs import fill, tmpfs

pytestmark = pytest.mark.integration


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _unfinished_erasure(disk, keys: str, log: str, sk: str) -> tuple[str, ...]:
    """acme's erasure, begun and cut short by a disk that filled while its pages were
    deleted: the keys are gone and the log holds no end. The key ids it began with."""
    ring = TenantKeyring(FileKeySource(keys))
    audit = AuditLog(log, load_signer(sk))
    eraser = Eraser(ring, audit, load_signer(sk))
    eraser.register_tier("directory", lambda _scope: fill(disk) or 0)
    with pytest.raises(ErasureUnrecorded):
        eraser.erase_tenant("acme", now=100.0)
    begun = eraser.unfinished("acme")
    audit.close()
    assert begun is not None and not ring.has_keys("acme")
    return begun.key_ids


@pytest.mark.parametrize("with_redis", [False, True])
def test_the_cli_lists_and_finishes_an_erasure_the_full_disk_left_without_receipt(
        tmp_path, capsys, acl_redis, with_redis):
    with tmpfs(tmp_path / "fs", 1 << 20) as disk:
        keys, log, sk, pk = (str(disk / n) for n in ("keys", "audit.log", "sk.pem", "pk.pem"))
        assert _run(capsys, "audit", "keygen", "--private", sk, "--public", pk)[0] == 0
        assert _run(capsys, "tenant", "create", "acme", "--keys-dir", keys)[0] == 0
        admin = redis.Redis.from_url(acl_redis.url)
        key = DirectoryBlinder(TenantKeyring(FileKeySource(keys))).directory_key("acme", b"k" * 32)
        admin.set(key, b"entry")  # what the service published for acme
        key_ids = _unfinished_erasure(disk, keys, log, sk)

        rc, out, _ = _run(capsys, "audit", "verify", log, "--public-key", pk)
        assert rc == 0 and out.startswith("PASS")
        assert "unfinished erasure of tenant acme" in out and "no receipt" in out
        erase = ("tenant", "erase", "acme", "--keys-dir", keys, "--audit-log", log,
                 "--signing-key", sk) + (("--redis-url", acl_redis.url) if with_redis else ())
        rc, _, err = _run(capsys, *erase)  # the disk is still full: said, nothing lost
        assert rc == 2 and "run the same erasure again" in err
        assert admin.exists(key) == (0 if with_redis else 1)  # the namespace its mark names

        (disk / "ballast").unlink()
        rc, out, _ = _run(capsys, *erase)
        receipt = json.loads(out)
        assert rc == 0 and tuple(receipt["key_ids"]) == key_ids and receipt["scope"] == "tenant"
        # (the entry went in the attempt before: a receipt counts its own attempt only)
        assert receipt["counts"] == ([["directory", 0]] if with_redis else [])
        rc, out, _ = _run(capsys, "audit", "verify", log, "--public-key", pk)
        assert rc == 0 and "unfinished" not in out
        admin.close()
