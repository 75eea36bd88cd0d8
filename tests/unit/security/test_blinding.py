"""Directory blinding and size buckets."""

from __future__ import annotations

import re

import pytest

from security.blinding import DirectoryBlinder, size_bucket
from security.errors import InvalidName, KeyUnavailable

DIGEST = bytes(range(32))


@pytest.mark.parametrize(("n", "bucket"), [(0, 4096), (1, 4096), (4096, 4096), (4097, 8192),
                                           (23_040 * 100, 4_194_304), (2**21, 2**21),
                                           (2**21 + 1, 2**22)])
def test_size_buckets(n, bucket):
    assert size_bucket(n) == bucket


@pytest.mark.parametrize("n", [-1, 1.5, True, "10"])
def test_size_bucket_rejects_non_sizes(n):
    with pytest.raises(ValueError):
        size_bucket(n)


def test_keys_are_per_tenant_and_opaque(keyring):
    blinder = DirectoryBlinder(keyring)
    a, b = blinder.blind_key("alice", DIGEST), blinder.blind_key("bob", DIGEST)
    assert len(a) == len(b) == 32 and a != b and DIGEST not in a
    assert blinder.blind_key("alice", DIGEST) == a  # stable
    assert blinder.blind_key("alice", bytes(32)) != a
    ns = blinder.namespace("alice")
    assert re.fullmatch(r"n[0-9a-f]{24}", ns) and ns != blinder.namespace("bob")
    key = blinder.directory_key("alice", DIGEST)
    assert key == f"akv:{{{ns}}}:e:".encode() + a.hex().encode()
    assert b"alice" not in key


def test_blinding_survives_a_new_process_and_dies_with_the_tenant(keyring):
    before = DirectoryBlinder(keyring).directory_key("alice", DIGEST)
    assert DirectoryBlinder(type(keyring)(keyring.source)).directory_key("alice", DIGEST) == before
    keyring.destroy_tenant("alice")
    with pytest.raises(KeyUnavailable, match="tenant alice has no keys"):
        DirectoryBlinder(type(keyring)(keyring.source)).blind_key("alice", DIGEST)


@pytest.mark.parametrize("digest", [b"", b"x" * 31, "0" * 32, None])
def test_bad_digest(keyring, digest):
    with pytest.raises(InvalidName):
        DirectoryBlinder(keyring).blind_key("alice", digest)
