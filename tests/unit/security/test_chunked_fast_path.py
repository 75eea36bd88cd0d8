"""The lean sealing path of record format 2 changes no sealed byte: a record sealed from
fixed keys and a fixed random stream, its padding read as zeros (the padding was zeros
then; it is noise now), has the digest the format had before the fast path (checked both
ways against the earlier code when it was written). Nonces drawn in blocks are never handed
out twice: not across threads, not to a forked child."""

from __future__ import annotations

import hashlib
import os
import random
import threading

import pytest

from security import _primitives as prim
from security.chunked import (
    CHUNK_OVERHEAD,
    HEAD_BYTES,
    Binding,
    ChunkedSealer,
    record_size,
)
from security.keyring import FileKeySource, TenantKeyring, blind_name, kek_name

# sha256 of the record below as the format-2 code before the fast path sealed it (four
# chunks: the geometry of a sealer with helper threads, and of every sealer before issue 13).
GOLDEN_DIGEST = "d7b06d413a2687be378c922737739aa02d3f4a19e4db6efbafb5cfeb9616dad3"
# The same page, key and random stream sealed by a one-thread sealer: one chunk (up to
# MAX_CHUNK) instead of four; preamble, meta block layout and chunk AAD are unchanged.
GOLDEN_ONE_THREAD_DIGEST = "776da1a223a56e94b288fcc6705cccee6694ec6b78174a0b45bd10d9ec55ed10"


def _fixed_ring(tmp_path) -> TenantKeyring:
    source = FileKeySource(tmp_path / "keys")
    source.create(blind_name("alice"), bytes(range(32)))
    source.create(kek_name("alice", 1), bytes(range(32, 64)))
    return TenantKeyring(source)


def _deterministic(monkeypatch, seed: int) -> None:
    rng = random.Random(seed)
    monkeypatch.setattr(prim, "random_bytes", lambda n: bytes(rng.getrandbits(8) for _ in range(n)))
    prim._NONCES.drop()


@pytest.mark.parametrize(("threads", "chunks", "golden"),
                         [(2, 4, GOLDEN_DIGEST), (4, 4, GOLDEN_DIGEST),
                          (1, 1, GOLDEN_ONE_THREAD_DIGEST)])
def test_the_record_bytes_are_those_of_format_2(tmp_path, monkeypatch, threads, chunks, golden):
    _deterministic(monkeypatch, 7)
    ring = _fixed_ring(tmp_path)
    page = (bytes(range(256)) * 2400)[:600_000]  # 4 chunks (1 on one thread) + padding
    binding = Binding(tenant="alice", generation=1, tier=2, slot_id=bytes(range(7, 39)),
                      digest=bytes(range(90, 122)), location=5)
    out = bytearray(b"\xaa" * record_size(len(page)))  # a slot's old bytes
    assert ChunkedSealer(ring, threads=threads).seal_into(out, page, binding, b"entry") == len(out)
    prim._NONCES.drop()
    used = HEAD_BYTES + len(page) + chunks * CHUNK_OVERHEAD
    pad = len(out) - used
    assert pad > 4096  # the keystream path (a few KiB and less: the CSPRNG, tested below)
    assert hashlib.sha256(out[:used] + bytes(pad)).hexdigest() == golden
    _assert_noise(bytes(out[used:]))
    for reader in (1, 2):  # every reader opens records of either geometry
        sealer = ChunkedSealer(ring, threads=reader)
        meta = sealer.read_meta(out, 2)
        assert meta.chunks == chunks
        assert bytes(sealer.open_into(out, binding)) == page
        assert bytes(sealer.open_into(out, binding, meta=meta)) == page
        open_chunk, piece = sealer.opener(out, meta, binding), bytearray(meta.chunk)
        for i, (start, length) in enumerate(meta.parts()):  # chunk by chunk (restores)
            assert open_chunk(i, piece) and piece[:length] == page[start:start + length]


def _assert_noise(pad: bytes) -> None:
    """Padding that shows neither a slot's old bytes nor where the sealed data ends."""
    assert len(pad) > 0
    assert pad.count(0) < len(pad) // 64 + 8 and pad.count(0xAA) < len(pad) // 64 + 8
    assert len(set(pad[-64:])) > 32  # the last bytes too: no zero run at the record's end


@pytest.mark.parametrize("n", [1, 5000, 600_000, 2 << 20])
def test_padding_is_noise_and_fresh_per_record(tmp_path, n):
    ring = _fixed_ring(tmp_path)
    page = bytes(n)  # all zeros: only the padding can make noise at the end
    binding = Binding(tenant="alice", generation=1, tier=2, slot_id=bytes(32),
                      digest=bytes(32), location=1)
    pads = []
    for threads in (1, 2):
        sealer = ChunkedSealer(ring, threads=threads)
        out = bytearray(record_size(n))
        sealer.seal_into(out, page, binding)
        meta = sealer.read_meta(out, 2)
        used = HEAD_BYTES + n + meta.chunks * CHUNK_OVERHEAD
        if used == len(out):
            continue  # this size fills its class exactly
        _assert_noise(bytes(out[used:]))
        pads.append(bytes(out[used:]))
        assert bytes(sealer.open_into(out, binding)) == page  # readers ignore padding
    assert pads and len(set(pads)) == len(pads)


def test_nonces_are_unique_across_threads():
    seen: list[bytes] = []
    lock = threading.Lock()

    def take() -> None:
        mine = [prim.random_nonces(5) for _ in range(2000)]
        with lock:
            seen.extend(mine)

    workers = [threading.Thread(target=take) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    nonces = {b[i:i + prim.NONCE_BYTES] for b in seen for i in range(0, len(b), prim.NONCE_BYTES)}
    assert len(nonces) == 4 * 2000 * 5


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_reuse_the_parents_next_nonces():
    prim.random_nonces(1)  # the parent holds a drawn block
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next nonces and leave at once
        os.close(read)
        os.write(write, prim.random_nonces(10))
        os._exit(0)
    os.close(write)
    child = b""
    while len(child) < 10 * prim.NONCE_BYTES:
        chunk = os.read(read, 4096)
        if not chunk:
            break
        child += chunk
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 10 * prim.NONCE_BYTES
    assert prim.random_nonces(10) != child  # without the at-fork drop they are equal
