"""Zero-copy host pool reads against a writer in another process: a view that ``unchanged``
confirms afterwards never holds a mix of two versions, and the check does catch rewrites."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest

from store.host_pool import HostPool, SlotEmpty, TornRead
from tests.integration.store.pool_worker import expected_fill
from tests.integration.store.test_host_pool_processes import _result, _seed, _spawn, _wait_ready

pytestmark = pytest.mark.integration



def _consistent(page: np.ndarray) -> bool:
    """Every page the writer writes names its version in its first 8 bytes and is filled
    with that version's byte: a mix of two versions fails this."""
    version = int(page[:8].view(np.uint64)[0])
    body = page[8:]
    fill = expected_fill(version)
    return int(body.min()) == fill and int(body.max()) == fill


def test_confirmed_views_are_never_torn_and_rewrites_are_caught(pool_name):
    _seed(pool_name, slots=2, slot_bytes=1 << 20)
    writer = _spawn("writer", pool_name, "120", "0", "1")  # until SIGTERM below
    _wait_ready(writer)
    reader = HostPool.attach(pool_name)
    counts = {"confirmed": 0, "mixed": 0, "caught": 0, "caught_mixed": 0}
    try:
        # Sample until both kinds were seen often enough (how many views survive a rewrite
        # depends on the machine's load), within the writer's lifetime.
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and not (
                counts["confirmed"] > 20 and counts["caught_mixed"] > 0):
            for slot in (0, 1):
                try:
                    view, seq = reader.view(slot)
                except (SlotEmpty, TornRead):
                    continue
                page = np.frombuffer(view, np.uint8).copy()  # "use" the bytes, slowly
                del view
                ok = _consistent(page)
                if reader.unchanged(slot, seq):
                    counts["confirmed"] += 1
                    counts["mixed"] += not ok
                else:
                    counts["caught"] += 1
                    counts["caught_mixed"] += not ok
    finally:
        reader.close()
        writer.send_signal(signal.SIGTERM)
    assert _result(writer)["writes"] > 0  # stopped once the reader saw enough (below)
    assert counts["mixed"] == 0, counts
    assert counts["confirmed"] > 20, counts
    # Control: the writer really did rewrite slots under open views, and some of those
    # views really were torn; ``unchanged`` caught every one of them.
    assert counts["caught"] > 0 and counts["caught_mixed"] > 0, counts
