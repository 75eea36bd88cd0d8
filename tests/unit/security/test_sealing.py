"""Sealing: round trips into reused buffers, bit flips (acceptance 1), moved pages (acceptance 2)."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from security.errors import InvalidName, InvalidSeal
from security.sealing import HEADER_BYTES, OVERHEAD, TenantSealer, sealed_size

DIGEST = bytes(range(32))
OTHER_DIGEST = bytes(range(1, 33))


def test_round_trip_into_reused_buffers(sealer):
    page = os.urandom(10_000)
    out = bytearray(sealed_size(len(page)) + 100)  # larger buffers are fine; a prefix is used
    sealed = sealer.seal("alice", DIGEST, 1, 2, 9, page, out=out)
    assert isinstance(sealed, memoryview) and sealed.nbytes == len(page) + OVERHEAD == 10_048
    plain = np.zeros(len(page), dtype=np.uint8)
    opened = sealer.open("alice", DIGEST, 1, 2, 9, sealed, out=plain)
    assert opened.nbytes == len(page) and plain.tobytes() == page


def test_round_trip_allocating_and_empty_page(sealer):
    for page in (b"", b"x", os.urandom(4097)):
        sealed = sealer.seal("alice", DIGEST, 1, 0, 0, page)
        assert len(sealed) == sealed_size(len(page))
        assert bytes(sealer.open("alice", DIGEST, 1, 0, 0, sealed)) == page


def test_same_plaintext_seals_differently(sealer):
    a = bytes(sealer.seal("alice", DIGEST, 1, 1, 1, b"same page"))
    b = bytes(sealer.seal("alice", DIGEST, 1, 1, 1, b"same page"))
    assert a != b and a[HEADER_BYTES:] != b[HEADER_BYTES:]


def test_ciphertext_holds_no_plaintext(sealer):
    page = b"TOOL:web_search " * 256
    sealed = bytes(sealer.seal("alice", DIGEST, 1, 1, 1, page))
    assert b"web_search" not in sealed and b"alice" not in sealed


def test_non_buffers_and_strided_views_are_a_clear_error(sealer):
    strided = np.zeros((4, 4), dtype=np.uint8)[:, ::2]
    for bad in ("text", 12, strided):
        with pytest.raises(TypeError, match="C-contiguous buffers"):
            sealer.seal("alice", DIGEST, 1, 1, 1, bad)


def test_too_small_out_buffer_is_a_clear_error(sealer):
    with pytest.raises(ValueError, match="at least 148 bytes"):
        sealer.seal("alice", DIGEST, 1, 1, 1, b"x" * 100, out=bytearray(147))
    with pytest.raises(ValueError, match="writable"):
        sealer.seal("alice", DIGEST, 1, 1, 1, b"x", out=bytes(100))


def test_random_bit_flips_are_all_rejected(sealer):
    """Acceptance 1: >= 10,000 single- and multi-bit flips in every region, no false accept."""
    rng = random.Random(20251129)
    page = os.urandom(200)
    sealed = bytes(sealer.seal("alice", DIGEST, 1, 1, 4, page))
    size = len(sealed)
    regions = {"magic+version+reserved": range(8), "epoch": range(8, 16),
               "nonce": range(16, 28), "reserved2": range(28, 32),
               "ciphertext": range(32, size - 16), "tag": range(size - 16, size)}
    hits = dict.fromkeys(regions, 0)
    out = bytearray(len(page))
    trials = 12_000
    for trial in range(trials):
        region = list(regions)[trial % len(regions)]
        buf = bytearray(sealed)
        for _ in range(1 if trial % 3 else rng.randint(2, 8)):  # a third are multi-bit flips
            pos = rng.choice(regions[region])
            buf[pos] ^= 1 << rng.randrange(8)
        if buf == sealed:
            continue  # two flips cancelled: not a tampered page
        with pytest.raises(InvalidSeal):
            sealer.open("alice", DIGEST, 1, 1, 4, buf, out=out)
        assert out == bytes(len(page))  # no unauthenticated plaintext left behind
        hits[region] += 1
    assert sum(hits.values()) >= 10_000
    assert min(hits.values()) >= 1_500, hits
    assert bytes(sealer.open("alice", DIGEST, 1, 1, 4, sealed)) == page  # control


def test_truncated_and_extended_pages_are_rejected(sealer):
    sealed = bytes(sealer.seal("alice", DIGEST, 1, 1, 4, b"page bytes"))
    for bad in (sealed[:-1], sealed[:OVERHEAD - 1], b"", sealed + b"\0", sealed[:HEADER_BYTES]):
        with pytest.raises(InvalidSeal):
            sealer.open("alice", DIGEST, 1, 1, 4, bad)


@pytest.mark.parametrize(
    ("label", "where"),
    [
        ("other slot", ("alice", DIGEST, 1, 1, 5)),
        ("other tier", ("alice", DIGEST, 1, 2, 4)),
        ("other generation", ("alice", DIGEST, 2, 1, 4)),
        ("other tenant", ("bob", DIGEST, 1, 1, 4)),
        ("other identity", ("alice", OTHER_DIGEST, 1, 1, 4)),
        ("public namespace", ("_public", DIGEST, 1, 1, 4)),
    ],
)
def test_valid_page_copied_elsewhere_is_rejected(keyring, sealer, label, where):
    """Acceptance 2: a valid sealed page in another slot, generation or tenant fails."""
    keyring.rotate("alice")  # generation 2 exists, so the replay is not just a missing key
    keyring.create_tenant("_public")
    page = os.urandom(512)
    sealed = bytes(sealer.seal("alice", DIGEST, 1, 1, 4, page))
    with pytest.raises(InvalidSeal):
        sealer.open(*where, sealed)
    assert bytes(sealer.open("alice", DIGEST, 1, 1, 4, sealed)) == page


def test_other_format_version_is_rejected(sealer):
    sealed = bytearray(sealer.seal("alice", DIGEST, 1, 1, 4, b"page"))
    sealed[4] = 2
    with pytest.raises(InvalidSeal):
        sealer.open("alice", DIGEST, 1, 1, 4, sealed)


def test_old_generation_stays_readable_after_rotation(keyring, sealer):
    old = bytes(sealer.seal("alice", DIGEST, 1, 1, 4, b"gen one"))
    assert keyring.rotate("alice") == 2
    new = bytes(sealer.seal("alice", DIGEST, 2, 1, 4, b"gen two"))
    assert bytes(sealer.open("alice", DIGEST, 1, 1, 4, old)) == b"gen one"
    assert bytes(sealer.open("alice", DIGEST, 2, 1, 4, new)) == b"gen two"


def test_nonce_budget_moves_to_a_fresh_data_key(small_budget_keyring):
    sealer = TenantSealer(small_budget_keyring)
    sealed = [bytes(sealer.seal("alice", DIGEST, 1, 1, i, b"p%d" % i)) for i in range(7)]
    epochs = [s[8:16] for s in sealed]
    assert epochs[0] == epochs[1] == epochs[2] != epochs[3]
    assert epochs[3] == epochs[4] == epochs[5] != epochs[6]
    assert small_budget_keyring.retired_epochs == 2
    assert small_budget_keyring.nonce_uses("alice", 1) == 1
    for i, s in enumerate(sealed):  # every retired data key still opens its pages
        assert bytes(sealer.open("alice", DIGEST, 1, 1, i, s)) == b"p%d" % i


def test_erased_generation_cannot_open(keyring, sealer):
    sealed = bytes(sealer.seal("alice", DIGEST, 1, 1, 4, b"secret"))
    keyring.rotate("alice")
    keyring.destroy_generation("alice", 1)
    with pytest.raises(InvalidSeal):
        sealer.open("alice", DIGEST, 1, 1, 4, sealed)
    with pytest.raises(InvalidSeal):  # a fresh keyring on the same directory cannot either
        TenantSealer(type(keyring)(keyring.source)).open("alice", DIGEST, 1, 1, 4, sealed)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("Alice", DIGEST, 1, 1, 1), "invalid tenant"),
        (("alice", DIGEST[:31], 1, 1, 1), "32 bytes"),
        (("alice", "0" * 32, 1, 1, 1), "32 bytes"),
        (("alice", DIGEST, 0, 1, 1), "generation"),
        (("alice", DIGEST, True, 1, 1), "generation"),
        (("alice", DIGEST, 1, 256, 1), "tier must be"),
        (("alice", DIGEST, 1, 1, -1), "slot"),
        (("alice", DIGEST, 1, 1.0, 1), "integers"),
    ],
)
def test_malformed_identity_is_a_clean_error(sealer, args, match):
    """Acceptance 9 (identities): bad bindings raise InvalidName, before any crypto."""
    with pytest.raises(InvalidName, match=match):
        sealer.seal(*args, b"page")
    with pytest.raises(InvalidName, match=match):
        sealer.open(*args, b"\0" * 64)
