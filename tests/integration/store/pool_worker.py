"""Helper processes for the cross-process host pool tests (run with ``python -m``).

    writer NAME SECONDS SLOT...   take the writer role; rewrite the slots until SECONDS pass
    reader NAME SECONDS SLOT...   read the slots in a loop; print a JSON verdict
                                  (also copies the raw slot bytes without the seqlock, as a
                                  control that shows the load really does tear unguarded reads)
    dump NAME                     attach, print every (slot, version, length) and the bytes' sums

Every page the writer writes is self-checking: its first 8 bytes hold the
version it will get, and the rest is filled with 0xAA (odd versions) or 0x55
(even versions), so any mix of two versions is visible to the reader.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time

import numpy as np

from store.host_pool import HostPool, SlotEmpty, TornRead

FILL = {1: 0xAA, 0: 0x55}


def expected_fill(version: int) -> int:
    return FILL[version & 1]


def make_pages(size: int) -> dict[int, np.ndarray]:
    return {parity: np.full(size, fill, dtype=np.uint8) for parity, fill in FILL.items()}


def check(buf: np.ndarray, version: int) -> bool:
    head = int(buf[:8].view(np.uint64)[0])
    body = buf[8:]
    fill = expected_fill(version)
    return head == version and int(body.min()) == fill and int(body.max()) == fill


def writer(name: str, seconds: float, slots: list[int]) -> None:
    """Rewrite ``slots`` for ``seconds``, or until SIGTERM (a test stops it once its
    reader is done, so the two overlap however slowly the reader started)."""
    pool = HostPool.attach(name, writer=True)
    versions = {s: v for s, v, _ in pool.slots()}
    pages = make_pages(pool.slot_bytes)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    writes = 0
    while time.monotonic() < deadline and not stop.is_set():
        for slot in slots:
            nxt = versions.get(slot, 0) + 1
            page = pages[nxt & 1]
            page[:8].view(np.uint64)[0] = nxt
            versions[slot] = pool.write(slot, page)
            writes += 1
    print(json.dumps({"writes": writes}), flush=True)


def reader(name: str, seconds: float, slots: list[int]) -> None:
    pool = HostPool.attach(name)
    out = np.empty(pool.slot_bytes, dtype=np.uint8)
    raw = np.empty(pool.slot_bytes, dtype=np.uint8)
    offsets = {s: pool.slot_offset(s) for s in slots}
    counts = {"good": 0, "bad": 0, "empty": 0, "raw_torn": 0}
    versions_seen: set[int] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for slot in slots:
            try:
                view, version = pool.read_versioned(slot, out=out)
            except (SlotEmpty, TornRead):
                counts["empty"] += 1
                continue
            if check(np.frombuffer(view, dtype=np.uint8), version):
                counts["good"] += 1
                versions_seen.add(version)
            else:
                counts["bad"] += 1
            raw[:] = pool.buffer[offsets[slot] : offsets[slot] + pool.slot_bytes]
            counts["raw_torn"] += int(raw[8:].min()) != int(raw[8:].max())
    print(json.dumps({**counts, "distinct_versions": len(versions_seen)}))


def dump(name: str) -> None:
    pool = HostPool.attach(name)
    rows = []
    for slot, version, length in pool.slots():
        data = np.frombuffer(pool.read(slot), dtype=np.uint8)
        rows.append([slot, version, length, bool(check(data, version))])
    print(json.dumps(rows))


if __name__ == "__main__":
    mode, pool_name = sys.argv[1], sys.argv[2]
    if mode == "dump":
        dump(pool_name)
    else:
        {"writer": writer, "reader": reader}[mode](
            pool_name, float(sys.argv[3]), [int(s) for s in sys.argv[4:]]
        )
