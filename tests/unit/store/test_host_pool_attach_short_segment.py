"""Attaching to a /dev/shm file shorter than a pool header
(a truncated segment, another program's file) is ``PoolFormatError``, as for any segment
that is not a pool, for readers and for a writer taking over; the file is left alone."""

from __future__ import annotations

import os
import uuid

import pytest

from store.host_pool import HostPool, PoolFormatError


@pytest.mark.parametrize("size", [1, 16, 40])
@pytest.mark.parametrize("writer", [False, True])
def test_a_segment_shorter_than_a_pool_header_is_not_a_pool(size, writer):
    name = f"akv-short-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path = f"/dev/shm/{name}"
    with open(path, "wb") as f:
        f.write(b"A" * size)
    try:
        with pytest.raises(PoolFormatError):
            HostPool.attach(name, writer=writer)
        assert os.path.getsize(path) == size
    finally:
        os.unlink(path)
