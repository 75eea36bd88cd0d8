"""`agentkv audit` prints paths and messages it did not write as text, never as Rich
markup: a log named ``a[/b]log`` ended in a MarkupError traceback (exit 1, like a FAIL),
``[i]log`` printed as ``log``, and a receipt problem lost its ``[tier, count]``."""

from __future__ import annotations

import json

import pytest

from agentkv_cluster.cli import main
from security.audit import AuditLog
from security.signing import load_signer


@pytest.fixture
def keys(tmp_path, capsys):
    sk, pk = str(tmp_path / "sk.pem"), str(tmp_path / "pk.pem")
    assert main(["audit", "keygen", "--private", sk, "--public", pk]) == 0
    capsys.readouterr()
    return sk, pk


@pytest.mark.parametrize("name", ["a[/b]log", "[i]log", "[bold red]x"])
def test_verify_prints_the_log_path_as_it_is(tmp_path, capsys, keys, name):
    sk, pk = keys
    log = tmp_path / name
    log.parent.mkdir(exist_ok=True)  # "a[" is a folder
    audit = AuditLog(log, load_signer(sk))
    audit.append("key.create", {"tenant": "acme", "generation": 1}, 1.0)
    audit.close(2.0)
    assert main(["audit", "verify", str(log), "--public-key", pk]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"PASS {log}: ")


def test_a_receipt_problem_keeps_its_brackets(tmp_path, capsys, keys):
    _sk, pk = keys
    receipt = tmp_path / "[i]receipt.json"
    fields = {"version": 1, "tenant": "acme", "scope": "tenant", "generation": None,
              "key_ids": [], "counts": [["directory", 4, 5]], "failed_tiers": [], "time": 1.0,
              "audit_seq": 0, "audit_hash": "0" * 64, "signer": "", "signature": ""}
    receipt.write_text(json.dumps(fields))
    assert main(["audit", "receipt", str(receipt), "--public-key", pk]) == 1
    out = capsys.readouterr().out
    assert out == f"FAIL {receipt}: receipt counts must be [tier, count] pairs\n"
