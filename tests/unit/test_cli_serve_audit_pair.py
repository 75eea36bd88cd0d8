"""``agentkv serve`` kept an ``audit.pub`` that is not the public half of ``audit.key`` in
its state directory, and every default ``agentkv audit verify`` then failed ("wrong
--public-key"). Such a state directory is refused in one line before Ray starts, and
neither file is touched."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agentkv_cluster.cli import main, serve
from security.signing import fingerprint, load_verifier, write_keypair


@pytest.fixture
def pairs(tmp_path: Path) -> Path:
    for name in ("a", "b"):
        write_keypair(tmp_path / f"{name}.key", tmp_path / f"{name}.pub")
    return tmp_path


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []
    monkeypatch.setattr(serve, "_serve", lambda _cfg, root: calls.append(root) or 0)
    return calls


def _state(pairs: Path, key: str, pub: str) -> Path:
    root = pairs / "state"
    root.mkdir()
    shutil.copy(pairs / key, root / "audit.key")
    shutil.copy(pairs / pub, root / "audit.pub")
    return root


def _serve(root: Path) -> int:
    return main(["serve", "--state-dir", str(root), "--port", "0", "--metrics-port", "0"])


def test_a_public_key_of_another_pair_is_refused(pairs, started, capsys) -> None:
    root = _state(pairs, "a.key", "b.pub")
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    assert _serve(root) == 2
    assert started == []
    err = capsys.readouterr().err
    pub, key = root / "audit.pub", root / "audit.key"
    assert err.count("\n") == 1
    assert err.startswith(
        f"agentkv serve: error: {pub} (key {fingerprint(load_verifier(pairs / 'b.pub').raw)}) "
        f"is not the public key of the signing key {key} (key "
        f"{fingerprint(load_verifier(pairs / 'a.pub').raw)})")
    assert f"openssl pkey -in {key} -pubout -out {pub}" in err
    assert {p.name: p.read_bytes() for p in root.iterdir()
            if p.name in before} == before  # neither file overwritten nor removed


def test_the_matching_pair_starts(pairs, started) -> None:
    root = _state(pairs, "a.key", "a.pub")
    assert _serve(root) == 0
    assert started == [root]


def test_a_public_key_that_is_not_a_key_is_refused(pairs, started, capsys) -> None:
    root = _state(pairs, "a.key", "a.pub")
    (root / "audit.pub").write_text("not a key\n")
    assert _serve(root) == 2 and started == []
    assert capsys.readouterr().err == (f"agentkv serve: error: public key {root / 'audit.pub'}: "
                                       "not a PEM Ed25519 public key\n")
