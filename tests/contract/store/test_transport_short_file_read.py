"""A file read that meets the end of the file before the
job's length is a FAILED result, never DONE: the bytes past the end were not moved, and a
caller that trusted DONE would use whatever its buffer held before."""

from __future__ import annotations

import os

import numpy as np
import pytest

from store.transport import (
    FileSpan,
    LocalCopyTransport,
    TransferJob,
    TransferOp,
    TransferStatus,
    file_transport,
    nixl_available,
)

KINDS = ["local"] + (["nixl-posix"] if nixl_available() else [])


@pytest.mark.parametrize("kind", KINDS)
def test_a_read_past_the_end_of_the_file_fails(tmp_path, kind):
    transport = LocalCopyTransport() if kind == "local" else file_transport(prefer_nixl=True)
    path = tmp_path / "f"
    path.write_bytes(b"A" * 1000)
    fd = os.open(path, os.O_RDWR)
    try:
        buf = np.full(8192, ord("Z"), np.uint8)
        local = transport.register(buf)
        remote = transport.register(FileSpan(fd=fd, length=1 << 20))
        job = transport.submit(TransferJob(op=TransferOp.READ, local=local, remote=remote,
                                           length=4096))
        result = transport.wait(job, timeout_s=10)
        assert result.status is TransferStatus.FAILED
    finally:
        transport.close()
        os.close(fd)
