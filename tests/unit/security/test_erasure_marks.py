"""``ErasureMarks`` fails closed: a key directory it cannot read keeps the erasures it
read last (before, every erasure was forgotten until the next good read, so a token
issued before an erasure passed the front's gate meanwhile); with nothing read yet an
unreadable directory is ``KeyUnavailable``, and only a missing one means no erasures."""

from __future__ import annotations

from pathlib import Path

import pytest

from security.erasure_marks import ErasureMarks
from security.errors import KeyUnavailable
from security.keyring import FileKeySource, TenantKeyring


def _marks(keys: Path) -> tuple[TenantKeyring, ErasureMarks]:
    ring = TenantKeyring(FileKeySource(keys))
    return ring, ErasureMarks(ring, str(keys), recheck_s=0.0)  # no cache: every call reads


def _break(keys: Path) -> Path:
    """The key directory turns unreadable: its path becomes a file (NotADirectoryError)."""
    away = keys.with_name("keys-away")
    keys.rename(away)
    keys.write_bytes(b"")
    return away


def test_an_unreadable_directory_keeps_the_erasures_read_last(tmp_path) -> None:
    keys = tmp_path / "keys"
    ring, marks = _marks(keys)
    ring.create_tenant("alice")
    ring.mark_erased("alice", 1_700_000_000.0)
    assert marks.erased_at("alice") == 1_700_000_000.0
    away = _break(keys)
    assert marks.erased_at("alice") == 1_700_000_000.0
    marks.invalidate()  # an erasure here asks for a fresh read: the last one still stands
    assert marks.erased_at("alice") == 1_700_000_000.0
    keys.unlink()
    away.rename(keys)
    ring.create_tenant("bob")
    ring.mark_erased("bob", 1_700_000_001.0)
    assert marks.all() == {"alice": 1_700_000_000.0, "bob": 1_700_000_001.0}  # read again


def test_with_nothing_read_an_unreadable_directory_is_an_error(tmp_path) -> None:
    keys = tmp_path / "keys"
    ring, marks = _marks(keys)
    ring.create_tenant("alice")
    _break(keys)
    with pytest.raises(KeyUnavailable, match="cannot be read"):
        marks.all()


def test_a_missing_directory_holds_no_erasures(tmp_path) -> None:
    keys = tmp_path / "keys"
    ring, marks = _marks(keys)
    assert marks.all() == {}
    ring.create_tenant("alice")
    ring.mark_erased("alice", 1_700_000_000.0)
    assert marks.erased_at("alice") == 1_700_000_000.0
