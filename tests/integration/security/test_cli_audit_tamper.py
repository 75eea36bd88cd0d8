"""``agentkv audit`` run as an admin runs it (a subprocess) on tampered logs and receipts:
one FAIL finding naming the line, exit status 1, no traceback; the untouched log passes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from security.audit import AuditLog, head_path
from security.erasure import Eraser
from security.keyring import FileKeySource, TenantKeyring
from security.signing import load_signer

pytestmark = pytest.mark.integration


def _cli(*argv: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "agentkv_cluster.cli", *argv],
                          capture_output=True, text=True, timeout=120, check=False)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture
def files(tmp_path):
    sk, pk = tmp_path / "sk.pem", tmp_path / "pk.pem"
    assert _cli("audit", "keygen", "--private", str(sk), "--public", str(pk))[0] == 0
    ring = TenantKeyring(FileKeySource(tmp_path / "keys"))
    ring.create_tenant("acme")
    log = AuditLog(tmp_path / "audit.log", load_signer(sk), checkpoint_every=4, fsync=False)
    for i in range(6):
        log.append("key.create", {"tenant": "acme", "i": i}, 100.0 + i)
    receipt = Eraser(ring, log, load_signer(sk)).erase_tenant("acme", 200.0)
    log.close(201.0)
    (tmp_path / "receipt.json").write_text(receipt.to_json())
    return tmp_path / "audit.log", pk, tmp_path / "receipt.json"


def _edit_line(path, index: int, edit) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    lines[index] = edit(lines[index])
    path.write_bytes(b"".join(lines))


TAMPERS = {
    # the text a reader greps names globex; the parser keeps the last key, acme
    "duplicate key": (lambda p: _edit_line(p, 2, lambda ln: ln.replace(
        b'"data":{', b'"data":{"tenant":"globex",', 1)), "line 3: record is not in the form"),
    "CRLF": (lambda p: _edit_line(p, 0, lambda ln: ln[:-1] + b"\r\n"),
             "line 1: record is not in the form"),
    "final newline cut": (lambda p: p.write_bytes(p.read_bytes()[:-1]),
                          "last line is incomplete"),
    "head file replaced by a folder": (lambda p: (head_path(p).unlink(), head_path(p).mkdir()),
                                       "cannot be read (Is a directory)"),
}


@pytest.mark.parametrize("kind", sorted(TAMPERS))
def test_tampered_log_fails_with_one_finding(files, kind):
    log, pk, receipt = files
    assert _cli("audit", "verify", str(log), "--public-key", str(pk))[0] == 0
    tamper, finding = TAMPERS[kind]
    tamper(log)
    rc, out = _cli("audit", "verify", str(log), "--public-key", str(pk))
    assert rc == 1 and out.startswith("FAIL") and finding in out, out
    assert "Traceback" not in out
    rc, out = _cli("audit", "receipt", str(receipt), "--public-key", str(pk), "--log", str(log))
    assert rc == 1 and "FAIL audit log" in out and finding in out and "Traceback" not in out


def test_receipt_and_log_checked_with_another_public_key(files, tmp_path):
    log, _, receipt = files
    other = tmp_path / "other.pem"
    assert _cli("audit", "keygen", "--private", str(tmp_path / "o.pem"), "--public", str(other))[0] == 0
    rc, out = _cli("audit", "verify", str(log), "--public-key", str(other))
    assert rc == 1 and "checkpoint signature does not verify: it names key" in out
    rc, out = _cli("audit", "receipt", str(receipt), "--public-key", str(other))
    assert rc == 1 and "receipt was signed by a different key" in out
    edited = json.loads(receipt.read_text()) | {"tenant": "globex"}
    receipt.write_text(json.dumps(edited))
    rc, out = _cli("audit", "receipt", str(receipt), "--public-key", str(files[1]))
    assert rc == 1 and "receipt altered or forged" in out and "Traceback" not in out
