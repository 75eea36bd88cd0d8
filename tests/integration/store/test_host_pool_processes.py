"""Host pool across real processes: no torn reads under load, SIGKILLed writers, attach/exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from store.host_pool import HostPool, SlotEmpty, TornRead
from tests.integration.store.pool_worker import check, make_pages

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]
SLOT = 4 << 20


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.store.pool_worker", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen, timeout: float = 60):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])



def _seed(name: str, slots: int, slot_bytes: int = SLOT) -> None:
    """Create the pool, write version 1 of every slot, then hand the writer role over."""
    with HostPool.create(name, slot_bytes, slots) as pool:
        page = make_pages(pool.slot_bytes)[1]
        page[:8].view(np.uint64)[0] = 1
        for _ in range(slots):
            pool.write(pool.alloc(), page)


def _wait_ready(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "ready", proc.stderr.read()


def test_reader_process_never_sees_a_torn_page_while_writer_rewrites(pool_name):
    _seed(pool_name, slots=2)
    writer = _spawn("writer", pool_name, "120", "0", "1")
    _wait_ready(writer)
    reader = _spawn("reader", pool_name, "2.5", "0", "1")
    seen = _result(reader)
    writer.send_signal(signal.SIGTERM)  # it wrote for the reader's whole run
    wrote = _result(writer)
    assert seen["bad"] == 0
    assert seen["good"] > 50 and seen["distinct_versions"] > 10
    assert seen["raw_torn"] > 0  # control: the same reads without the seqlock do tear
    assert wrote["writes"] > 100


def test_writer_killed_mid_write_leaves_no_torn_page(pool_name):
    _seed(pool_name, slots=2, slot_bytes=32 << 20)
    out = np.empty(32 << 20, dtype=np.uint8)
    torn_rounds = 0
    for round_ in range(6):
        writer = _spawn("writer", pool_name, "30", "0")  # slot 1 keeps its last page
        _wait_ready(writer)
        time.sleep(0.05 + 0.03 * round_)
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
        with HostPool.attach(pool_name) as reader:
            view, version = reader.read_versioned(1, out=out)
            assert check(np.frombuffer(view, np.uint8), version)
            try:
                view, version = reader.read_versioned(0, out=out)
                assert check(np.frombuffer(view, np.uint8), version)
            except TornRead as exc:
                assert "died mid-write" in str(exc)
                torn_rounds += 1
        with HostPool.attach(pool_name, writer=True) as recovering:
            try:
                view, version = recovering.read_versioned(0, out=out)
                assert check(np.frombuffer(view, np.uint8), version)
            except SlotEmpty:
                page = make_pages(recovering.slot_bytes)[1]
                page[:8].view(np.uint64)[0] = recovering.write(0, b"probe") + 1
                assert recovering.write(0, page) == int(page[:8].view(np.uint64)[0])
    assert torn_rounds >= 1, "no kill landed mid-write in 6 rounds"


def test_attached_reader_finds_pages_by_slot_and_its_exit_keeps_the_segment(pool_name):
    _seed(pool_name, slots=3, slot_bytes=1 << 20)
    with HostPool.attach(pool_name, writer=True) as pool:
        pool.free(1)
        proc = _spawn("dump", pool_name)
        rows = _result(proc)
        assert rows == [[0, 1, 1 << 20, True], [2, 1, 1 << 20, True]]
        assert os.path.exists(f"/dev/shm/{pool_name}")
        assert pool.stats().used_slots == 2 and pool.alloc() == 1
