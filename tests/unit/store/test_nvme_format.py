"""The NVMe record format: header round trip, each kind of damage, resynchronising scan."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from store.nvme import format as fmt


def packed(key: bytes = b"key", **fields) -> bytes:
    header = fmt.RecordHeader(
        **{
            "flags": 0,
            "key": key,
            "generation": 3,
            "payload_len": 10,
            "seq": 42,
            "payload_hash": 2**64 - 7,
            **fields,
        }
    )
    buf = bytearray(fmt.header_block(len(key), 512))
    fmt.pack_header_into(memoryview(buf), header)
    return bytes(buf)


def test_header_round_trip():
    h = fmt.parse_header(packed(b"k" * 255, flags=fmt.FLAG_TOMBSTONE, generation=2**40))
    assert (h.key, h.generation, h.payload_len, h.seq, h.payload_hash) == (
        b"k" * 255,
        2**40,
        10,
        42,
        2**64 - 7,
    )
    assert h.is_tombstone


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda b: b[:20], "truncated header"),
        (lambda b: b"XKVR" + b[4:], "bad magic"),
        (lambda b: b[:4] + b"\x03\x00" + b[6:], "unknown record version"),
        (lambda b: b[:20] + bytes([b[20] ^ 1]) + b[21:], "header checksum mismatch"),
        (lambda b: b[: fmt.HEADER.size + 1], "bad or truncated key"),
        (
            lambda b: b[: fmt.HEADER.size] + b"kez" + b[fmt.HEADER.size + 3 :],
            "header checksum mismatch",
        ),
    ],
)
def test_damaged_headers_are_rejected(damage, message):
    with pytest.raises(fmt.RecordFormatError, match=message):
        fmt.parse_header(damage(packed()))


def test_checksum_is_xxh3_64():
    assert fmt.checksum(b"") == 0x2D06800538D394C2  # XXH3-64 of the empty input, seed 0
    assert fmt.checksum(b"a" * 4096) != fmt.checksum(b"a" * 4095 + b"b")


def test_payload_digest_is_xxh3_up_to_one_stripe_then_hashes_stripe_hashes():
    stripe = fmt.STRIPE_BYTES
    small = bytes(range(256)) * (stripe // 256)  # exactly one stripe
    assert fmt.payload_digest(small) == fmt.checksum(small)
    big = small + b"tail"  # two stripes, the last one partial
    stripes = [fmt.checksum(small), fmt.checksum(b"tail")]
    assert fmt.payload_digest(big) == fmt.checksum(struct.pack("<2Q", *stripes))
    assert fmt.payload_digest(big) == fmt.combine(stripes) != fmt.checksum(big)
    assert fmt.payload_digest(big, version=1) == fmt.checksum(big)  # version 1: one pass
    arr = np.frombuffer(big[: 2 * 4096], np.float16)  # any buffer, hashed as its bytes
    assert fmt.payload_digest(arr) == fmt.checksum(big[: 2 * 4096])


def test_version_1_headers_still_parse_and_later_ones_do_not():
    assert fmt.parse_header(packed(version=1)).version == 1
    assert fmt.parse_header(packed()).version == fmt.FORMAT_VERSION == 2
    with pytest.raises(fmt.RecordFormatError, match="unknown record version 3"):
        fmt.parse_header(packed(version=3))


def test_sizes_are_aligned():
    assert fmt.header_block(1, 4096) == 4096
    assert fmt.header_block(255, 512) == 512
    assert fmt.round_up(4097, 4096) == 8192 and fmt.round_up(4096, 4096) == 4096


def _record(key: bytes, payload: bytes, seq: int, align: int) -> bytes:
    header = fmt.RecordHeader(
        flags=0,
        key=key,
        generation=1,
        payload_len=len(payload),
        seq=seq,
        payload_hash=fmt.checksum(payload),
    )
    buf = bytearray(fmt.header_block(len(key), align))
    fmt.pack_header_into(memoryview(buf), header)
    body = bytes(buf) + payload
    return body + bytes(fmt.round_up(len(body), align) - len(body))


def test_scan_skips_a_damaged_record_and_finds_the_next(tmp_path):
    align = 512
    recs = [_record(b"k%d" % i, bytes([i]) * 1000, i + 1, align) for i in range(3)]
    blob = bytearray(b"".join(recs))
    blob[len(recs[0]) + 10] ^= 0xFF  # break the second record's header
    path = tmp_path / "seg"
    path.write_bytes(bytes(blob[: -(len(recs[2]) - 512 - 1000)]))  # last record exactly complete
    fd = os.open(path, os.O_RDONLY)
    try:
        found = list(fmt.scan_segment(fd, path.stat().st_size, align))
    finally:
        os.close(fd)
    assert [r.header.key for r in found] == [b"k0", b"k2"]
    assert found[1].offset == len(recs[0]) + len(recs[1])
    assert found[1].end == path.stat().st_size


def test_scan_stops_at_a_torn_record_and_never_reads_its_payload_as_records(tmp_path):
    # A value that carries, on an ``align`` boundary, the image of a whole record for
    # another key; a crash mid-append leaves the value cut short. Its bytes are the torn
    # record's own payload: the forged record must not be found.
    align = 512
    good = _record(b"victim", b"the real value", 1, align)
    forged = _record(b"victim", b"FORGED", 1 << 40, align)
    value = bytes(align) + forged + bytes(8 * align)
    torn = _record(b"big", value, 2, align)
    cut = len(good) + fmt.header_block(3, align) + align + len(forged) + 100  # inside `value`
    path = tmp_path / "seg"
    path.write_bytes((good + torn)[:cut])
    fd = os.open(path, os.O_RDONLY)
    try:
        found = list(fmt.scan_segment(fd, cut, align))
    finally:
        os.close(fd)
    assert [(r.header.key, r.header.seq) for r in found] == [(b"victim", 1)]
    assert found[0].end == fmt.header_block(6, align) + len(b"the real value")
