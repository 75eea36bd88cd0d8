"""Chunked sealing (record format 2): round trips, a header that names nothing, padded
lengths, and tampering (reorder, truncate, duplicate, splice across pages and tenants,
bit flips) over 10,000+ trials with zero false accepts."""

from __future__ import annotations

import os
import random
import tempfile

import numpy as np
import pytest

from security.chunked import (
    CHUNK_OVERHEAD,
    HEAD_BYTES,
    MAX_APP_BYTES,
    PREAMBLE_BYTES,
    Binding,
    ChunkedSealer,
    is_chunked,
    record_size,
    size_class,
)
from security.errors import InvalidName, InvalidSeal
from security.keyring import FileKeySource, KeyringConfig, TenantKeyring

SLOT = bytes(range(100, 132))
DIGEST = bytes(range(32))


def bind(tenant: str = "alice", digest: bytes = DIGEST, slot: bytes = SLOT, *, tier: int = 1,
         location: int = 7, generation: int = 1) -> Binding:
    return Binding(tenant=tenant, generation=generation, tier=tier, slot_id=slot, digest=digest,
                   location=location)


@pytest.fixture
def chunked(keyring) -> ChunkedSealer:
    if not keyring.generations("bob"):
        keyring.create_tenant("bob")
    return ChunkedSealer(keyring, threads=2)


def seal(sealer: ChunkedSealer, page: bytes, b: Binding, app: bytes = b"") -> bytearray:
    out = bytearray(record_size(len(page)))
    assert sealer.seal_into(out, page, b, app) == len(out)
    return out


def test_round_trips_every_size_into_caller_buffers(chunked):
    for n in (0, 1, 4095, 4096, 4097, 100_000, 2 << 20, (2 << 20) + 5, 5 * (1 << 20) + 123):
        page = os.urandom(n)
        record = seal(chunked, page, bind(), app=b"index entry")
        meta = chunked.read_meta(record, 1)  # no tenant given: found by its key id
        assert (meta.tenant, meta.generation, meta.nbytes, meta.app) == (
            "alice", 1, n, b"index entry")
        out = np.zeros(n + 10, np.uint8)
        opened = chunked.open_into(record, bind(), out)
        assert bytes(opened) == page and opened.nbytes == n
        assert bytes(chunked.open_into(record, bind())) == page


def test_lengths_are_padded_to_size_classes(chunked):
    assert size_class(1) == size_class(4096) == 4096
    assert [size_class(n) for n in (4097, 5121, 8192, (1 << 20) + 1)] == [5120, 6144, 8192,
                                                                         5 << 18]
    # Every length of a class gives one record size, so a stored length names the class only.
    sizes = {len(seal(chunked, os.urandom(n), bind())) for n in range(5121, 6145, 97)}
    assert sizes == {record_size(6144)}
    for n in range(1, 1 << 22, 4099):
        assert n <= size_class(n) <= max(4096, 1.25 * n + 1)


def test_the_clear_header_names_only_version_key_id_and_slot(chunked, keyring):
    page = b"TOOL:web_search " * 4096
    app = b"alice's index entry with shape [30, 3, 512, 64]"
    record = bytes(seal(chunked, page, bind(), app))
    assert is_chunked(record)
    for secret in (b"alice", b"web_search", b"index entry", DIGEST, (7).to_bytes(8, "big"),
                   len(page).to_bytes(8, "big"), len(page).to_bytes(4, "big")):
        assert secret not in record
    pre = record[:PREAMBLE_BYTES]
    assert pre[:5] == b"AKVC\x02" and pre[-32:] == SLOT  # version ... slot identity
    key_id = chunked.key_id("alice", 1)
    assert pre[8:24] == key_id
    assert key_id != chunked.key_id("bob", 1)
    keyring.rotate("alice")
    assert chunked.key_id("alice", 2) != key_id
    # The rest of the clear bytes are the data-key epoch and random nonces.
    other = bytes(seal(chunked, page, bind()))
    assert record[HEAD_BYTES + 12:HEAD_BYTES + 64] != other[HEAD_BYTES + 12:HEAD_BYTES + 64]


def test_bad_bindings_and_buffers_are_clear_errors(chunked):
    with pytest.raises(InvalidName):
        bind(slot=b"short")
    with pytest.raises(InvalidName):
        bind(tenant="Not A Tenant")
    with pytest.raises(ValueError, match="at least"):
        chunked.seal_into(bytearray(100), b"x", bind())
    with pytest.raises(ValueError, match="writable"):
        chunked.seal_into(bytes(record_size(1)), b"x", bind())
    with pytest.raises(ValueError, match="app metadata"):
        seal(chunked, b"x", bind(), app=bytes(MAX_APP_BYTES + 1))
    with pytest.raises(TypeError, match="C-contiguous"):
        seal(chunked, "text", bind())  # type: ignore[arg-type]


def test_each_chunk_takes_a_nonce_from_the_budget(tmp_path):
    ring = TenantKeyring(FileKeySource(tmp_path), KeyringConfig(nonce_limit=12))
    ring.create_tenant("alice")
    sealer = ChunkedSealer(ring, threads=2)
    first = seal(sealer, os.urandom(2 << 20), bind())  # 4 chunks + the meta block
    assert ring.nonce_uses("alice", 1) == 5
    second = seal(sealer, os.urandom(2 << 20), bind())
    assert ring.nonce_uses("alice", 1) == 10 and chunked_epoch(second) == chunked_epoch(first)
    record = seal(sealer, os.urandom(2 << 20), bind())  # 10 + 5 > 12: a fresh epoch
    assert ring.nonce_uses("alice", 1) == 5 and ring.retired_epochs == 1
    assert chunked_epoch(record) != chunked_epoch(first)
    assert sealer.read_meta(record, 1).chunks == 4
    one = seal(ChunkedSealer(ring, threads=1), os.urandom(2 << 20), bind())  # 1 chunk + meta
    assert ring.nonce_uses("alice", 1) == 7 and sealer.read_meta(one, 1).chunks == 1


def chunked_epoch(record: bytes | bytearray) -> int:
    return int.from_bytes(bytes(record[24:32]), "big")


def test_erased_keys_and_unknown_key_ids_do_not_open(chunked, keyring):
    record = seal(chunked, os.urandom(50_000), bind())
    fresh = ChunkedSealer(TenantKeyring(keyring.source))
    assert fresh.read_meta(record, 1).tenant == "alice"  # a restarted reader finds the key
    keyring.destroy_tenant("alice")
    fresh.keyring.forget("alice")  # another process learns of the erasure
    for reader in (chunked, fresh, ChunkedSealer(TenantKeyring(keyring.source))):
        with pytest.raises(InvalidSeal):
            reader.read_meta(record, 1)
        with pytest.raises(InvalidSeal):
            reader.open_into(record, bind())


# -- tampering --------------------------------------------------------------------------------
PAGE = 300_000  # 4 chunks of 80 KiB: cheap enough for 10,000+ trials
TRIALS = 10_200


def _chunk_span(record: bytes | bytearray, i: int, sealer: ChunkedSealer) -> slice:
    meta = sealer.read_meta(record, 1, "alice", 1)
    off = meta.chunk_offset(i)
    return slice(off, off + CHUNK_OVERHEAD + min(meta.chunk, meta.nbytes - i * meta.chunk))


def test_tampered_records_never_open(chunked):
    """Reorder, truncate, duplicate, splice (other page, other slot, other tenant, old
    generation of the same page), bit flips in every part, and wrong bindings: 10,200
    trials, every one refused, and the destination never holds plaintext afterwards."""
    rng = random.Random(1234)
    page = os.urandom(PAGE)
    good = bytes(seal(chunked, page, bind()))
    others = {
        "page": bytes(seal(chunked, os.urandom(PAGE), bind(digest=bytes(32)))),
        "same page again": bytes(seal(chunked, page, bind())),
        "slot": bytes(seal(chunked, page, bind(slot=bytes(32)))),
        "location": bytes(seal(chunked, page, bind(location=8))),
        "tier": bytes(seal(chunked, page, bind(tier=2))),
        "tenant": bytes(seal(chunked, page, bind("bob"))),
    }
    meta = chunked.read_meta(good, 1)
    spans = [_chunk_span(good, i, chunked) for i in range(meta.chunks)]
    full = [i for i in range(meta.chunks) if spans[i].stop - spans[i].start == spans[0].stop
            - spans[0].start]
    used = spans[-1].stop
    out = np.zeros(PAGE, np.uint8)

    def reorder(r: bytearray) -> str:
        i, j = rng.sample(full, 2)
        r[spans[i]], r[spans[j]] = good[spans[j]], good[spans[i]]
        return "reorder"

    def truncate(r: bytearray) -> str:
        del r[rng.randrange(0, used):]
        return "truncate"

    def drop_chunk(r: bytearray) -> str:  # a chunk cut out, the rest shifted up
        i = rng.randrange(meta.chunks)
        del r[spans[i]]
        return "drop"

    def duplicate(r: bytearray) -> str:
        i, j = rng.sample(full, 2)
        r[spans[j]] = good[spans[i]]
        return "duplicate"

    def splice(r: bytearray) -> str:
        name = rng.choice(sorted(others))
        src = others[name]
        what = rng.choice(("chunk", "meta", "preamble", "meta+preamble"))
        if what == "chunk":
            i = rng.randrange(meta.chunks)
            r[spans[i]] = src[spans[i]]
        elif what == "meta":
            r[PREAMBLE_BYTES:HEAD_BYTES] = src[PREAMBLE_BYTES:HEAD_BYTES]
        elif what == "preamble":
            r[:PREAMBLE_BYTES] = src[:PREAMBLE_BYTES]
        else:
            r[:HEAD_BYTES] = src[:HEAD_BYTES]
        return "splice"

    def flip(r: bytearray) -> str:
        at = rng.randrange(0, used)
        r[at] ^= 1 << rng.randrange(8)
        return "flip"

    wrong = [bind(digest=bytes(32)), bind(slot=bytes(32)), bind(location=8), bind(tier=2),
             bind("bob")]

    def binding(r: bytearray) -> str:
        return "binding"

    kinds = (reorder, truncate, drop_chunk, duplicate, splice, flip, binding)
    seen: dict[str, int] = {}
    accepted = 0
    for trial in range(TRIALS + 600):
        record = bytearray(good)
        kind = kinds[trial % len(kinds)](record)
        if kind != "binding" and record == good:
            continue  # a splice that changed nothing (e.g. the same preamble): no tamper
        seen[kind] = seen.get(kind, 0) + 1
        b = rng.choice(wrong) if kind == "binding" else bind()
        out[:] = 0xAA
        try:
            chunked.open_into(record, b, out)
        except (InvalidSeal, ValueError):
            # refused before any chunk opened (untouched), or every opened chunk wiped
            assert (out == 0xAA).all() or not out.any(), kind
            continue
        accepted += 1
    assert accepted == 0
    assert sum(seen.values()) >= 10_000 and min(seen.values()) > 1_000, seen
    # control: the untouched record opens under the right binding
    assert bytes(chunked.open_into(good, bind(), out)) == page


def test_tampered_records_of_either_geometry_never_open(chunked, keyring):
    """A one-thread sealer seals in one chunk (up to MAX_CHUNK) where helpers get four; the
    meta block names the geometry. Tampering a one-chunk record (truncate, drop its chunk,
    bit flips, splices from other records) and splicing between the two geometries of the
    same page under the same binding (one's head on the other's chunks, one's chunk bytes in
    the other): 4,200 trials, opened by readers of both kinds, none opens."""
    one = ChunkedSealer(keyring, threads=1)
    rng = random.Random(4321)
    page = os.urandom(PAGE)
    goods = {1: bytes(seal(one, page, bind())), 4: bytes(seal(chunked, page, bind()))}
    assert [one.read_meta(goods[k], 1).chunks for k in (1, 4)] == [1, 4]
    others = [bytes(seal(one, p, b)) for p, b in (
        (page, bind()), (os.urandom(PAGE), bind(digest=bytes(32))),
        (page, bind(slot=bytes(32))), (page, bind("bob")))]
    used = {k: _chunk_span(goods[k], one.read_meta(goods[k], 1).chunks - 1, one).stop
            for k in goods}
    out = np.zeros(PAGE, np.uint8)
    seen: dict[str, int] = {}
    accepted = 0
    for trial in range(4_200):
        kind = ("truncate", "drop", "flip", "splice", "geometry", "binding")[trial % 6]
        base = 1 if kind != "geometry" else rng.choice((1, 4))
        r, b = bytearray(goods[base]), bind()
        if kind == "truncate":
            del r[rng.randrange(0, used[1]):]
        elif kind == "drop":
            del r[_chunk_span(r, 0, one)]
        elif kind == "flip":
            r[rng.randrange(0, used[1])] ^= 1 << rng.randrange(8)
        elif kind == "splice":
            src = rng.choice(others)
            cut = rng.choice((slice(HEAD_BYTES, used[1]), slice(0, HEAD_BYTES),
                              slice(PREAMBLE_BYTES, HEAD_BYTES), slice(0, PREAMBLE_BYTES)))
            r[cut] = src[cut]
        elif kind == "geometry":  # the other geometry's head, or a stretch of its chunk bytes
            src = goods[5 - base]
            if rng.random() < 0.5:
                r[:HEAD_BYTES] = src[:HEAD_BYTES]
            else:
                at = rng.randrange(HEAD_BYTES, min(used.values()) - 64)
                r[at:at + 64] = src[at:at + 64]
        else:
            b = rng.choice([bind(digest=bytes(32)), bind(slot=bytes(32)), bind(location=8),
                            bind(tier=2), bind("bob")])
        if kind != "binding" and r == goods[base]:
            continue
        seen[kind] = seen.get(kind, 0) + 1
        out[:] = 0xAA
        try:
            (one if trial % 2 else chunked).open_into(r, b, out)
        except (InvalidSeal, ValueError):
            assert (out == 0xAA).all() or not out.any(), kind
            continue
        accepted += 1
    assert accepted == 0
    assert sum(seen.values()) >= 4_000 and min(seen.values()) > 600, seen
    for reader in (one, chunked):  # control: both records open under the right binding
        assert all(bytes(reader.open_into(goods[k], bind(), out)) == page for k in goods)


def test_a_failed_open_leaves_no_plaintext(chunked):
    page = os.urandom(PAGE)
    record = bytearray(seal(chunked, page, bind()))
    record[_chunk_span(record, 3, chunked).start + 20] ^= 1  # the last chunk
    out = np.full(PAGE, 0xAA, np.uint8)
    with pytest.raises(InvalidSeal):
        chunked.open_into(record, bind(), out)
    assert not out.any()  # the chunks that did open were wiped too


def test_many_threads_seal_and_open_at_once(chunked):
    from concurrent.futures import ThreadPoolExecutor

    pages = [os.urandom(700_000 + i) for i in range(8)]

    def trip(i: int) -> bool:
        b = bind(digest=bytes([i]) * 32)
        return bytes(chunked.open_into(seal(chunked, pages[i], b), b)) == pages[i]

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(trip, range(8)))


def test_key_ids_are_found_after_a_restart_with_many_tenants():
    with tempfile.TemporaryDirectory() as d:
        ring = TenantKeyring(FileKeySource(d))
        for t in ("t1", "t2", "t3"):
            ring.create_tenant(t)
        ring.rotate("t2")
        records = {t: seal(ChunkedSealer(ring), b"x" * 10, bind(t, generation=2 if t == "t2"
                                                                else 1)) for t in ("t1", "t2",
                                                                                   "t3")}
        fresh = ChunkedSealer(TenantKeyring(FileKeySource(d)))
        assert {t: (m.tenant, m.generation) for t, m in
                ((t, fresh.read_meta(r, 1)) for t, r in records.items())} == {
            "t1": ("t1", 1), "t2": ("t2", 2), "t3": ("t3", 1)}


def test_forget_drops_what_names_the_erased_tenant_and_nothing_of_the_others(chunked):
    """Erasure (the pool's ``purge_tenant``): the sealer's caches no longer name the tenant
    (they kept one entry per tenant and generation ever sealed for)."""
    alice, bob = os.urandom(5000), os.urandom(5000)
    records = {"alice": seal(chunked, alice, bind()), "bob": seal(chunked, bob, bind("bob"))}
    for record in records.values():
        chunked.read_meta(record, 1)  # fills the key-id table

    def named() -> set[str]:
        return {t for t, _ in chunked._own} | {t for t, _ in chunked._ids.values()}

    assert named() == {"alice", "bob"}
    chunked.forget("alice", generation=2)  # another generation: nothing of generation 1 goes
    assert named() == {"alice", "bob"}
    chunked.forget("alice")
    assert named() == {"bob"}
    assert bytes(chunked.open_into(records["bob"], bind("bob"))) == bob
    assert chunked.read_meta(records["bob"], 1).tenant == "bob"
