"""One contract, every transport: local copy (memory and file), NIXL POSIX (real files)
and NIXL UCX (real agents in two processes, metadata exchanged as bytes)."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from store.transport import (
    FileSpan,
    InvalidTransfer,
    LocalCopyTransport,
    MemKind,
    Region,
    TransferJob,
    TransferOp,
    TransferStatus,
    TransportClosed,
    UnknownPeer,
    nixl_available,
)

REMOTE_BYTES = 16 << 20
needs_nixl = pytest.mark.skipif(not nixl_available(), reason="NIXL is not installed")


def aligned(n: int) -> np.ndarray:
    buf = np.frombuffer(mmap.mmap(-1, n), dtype=np.uint8)
    buf[:] = 0
    return buf


def pattern(n: int, seed: int) -> np.ndarray:
    out = aligned(n)
    out[:] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    return out


class MemoryHarness:
    """The remote side is a second buffer of the same local transport."""

    def __init__(self) -> None:
        self.transport = LocalCopyTransport()
        self._buf = aligned(REMOTE_BYTES)
        self.remote = self.transport.register(self._buf)

    def new_transport(self):
        return LocalCopyTransport()

    def remote_read(self, offset: int, length: int) -> bytes:
        return self._buf[offset : offset + length].tobytes()

    def remote_fill(self, offset: int, data: bytes) -> None:
        self._buf[offset : offset + len(data)] = np.frombuffer(data, np.uint8)

    def close(self) -> None:
        self.transport.close()


class FileHarness:
    """The remote side is a real file, registered as a FileSpan."""

    def __init__(self, transport_cls, tmp_path) -> None:
        self.transport_cls = transport_cls
        self.transport = transport_cls()
        self._fd = os.open(tmp_path / "remote.bin", os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(self._fd, REMOTE_BYTES)
        self.remote = self.transport.register(FileSpan(fd=self._fd, length=REMOTE_BYTES))

    def new_transport(self):
        return self.transport_cls()

    def remote_read(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, offset)

    def remote_fill(self, offset: int, data: bytes) -> None:
        os.pwrite(self._fd, data, offset)

    def close(self) -> None:
        self.transport.close()
        os.close(self._fd)


class UcxHarness:
    """The remote side is a buffer in another process, behind its own NIXL agent."""

    def __init__(self) -> None:
        from store.transport.nixl_ucx import NixlUcxTransport
        from store.transport.peer import PeerProcess

        self._cls = NixlUcxTransport
        self.transport = NixlUcxTransport(lanes=2)  # large jobs split in two (see below)
        self.peer = PeerProcess(self.transport, REMOTE_BYTES)
        self.remote = self.peer.region

    def new_transport(self):
        return self._cls()

    def remote_read(self, offset: int, length: int) -> bytes:
        return self.peer.read(offset, length)

    def remote_fill(self, offset: int, data: bytes) -> None:
        self.peer.fill(offset, data)

    def close(self) -> None:
        self.peer.close()
        self.transport.close()


@pytest.fixture(scope="module")
def ucx_harness():
    harness = UcxHarness()
    yield harness
    harness.close()


@pytest.fixture(
    params=[
        "local-memory",
        "local-file",
        pytest.param("nixl-posix", marks=needs_nixl),
        pytest.param("nixl-ucx", marks=needs_nixl),
    ]
)
def harness(request, tmp_path):
    if request.param == "nixl-ucx":
        h = request.getfixturevalue("ucx_harness")
        h.remote_fill(0, bytes(REMOTE_BYTES))  # shared across tests: start from zeros
        yield h
        return
    if request.param == "local-memory":
        h = MemoryHarness()
    elif request.param == "local-file":
        h = FileHarness(LocalCopyTransport, tmp_path)
    else:
        from store.transport.nixl_posix import NixlPosixTransport

        h = FileHarness(NixlPosixTransport, tmp_path)
    yield h
    h.close()


def write_job(
    local: Region,
    remote: Region,
    length: int,
    *,
    local_offset: int = 0,
    remote_offset: int = 0,
    op: TransferOp = TransferOp.WRITE,
) -> TransferJob:
    return TransferJob(
        op=op,
        local=local,
        remote=remote,
        length=length,
        local_offset=local_offset,
        remote_offset=remote_offset,
    )


def test_write_then_read_back_with_offsets(harness):
    t = harness.transport
    src = pattern(1 << 20, seed=1)
    src_region = t.register(src)
    n, loff, roff = 300_001, 4_099, 65_536 + 13
    result = t.wait(
        t.submit(write_job(src_region, harness.remote, n, local_offset=loff, remote_offset=roff))
    )
    assert (result.status, result.nbytes) == (TransferStatus.DONE, n)
    assert harness.remote_read(roff, n) == src[loff : loff + n].tobytes()
    assert harness.remote_read(roff - 1, 1) == b"\0"  # nothing written before the range

    dst = aligned(1 << 20)
    dst_region = t.register(dst)
    back = t.wait(
        t.submit(
            write_job(
                dst_region,
                harness.remote,
                n,
                local_offset=7,
                remote_offset=roff,
                op=TransferOp.READ,
            )
        )
    )
    assert back.status is TransferStatus.DONE
    assert dst[7 : 7 + n].tobytes() == src[loff : loff + n].tobytes()
    assert not dst[:7].any() and not dst[7 + n :].any()
    t.deregister(src_region)
    t.deregister(dst_region)


def test_a_large_job_lands_whole_and_exact(harness):
    """Large jobs (NIXL UCX: split across lanes, each part on its own thread) move every
    byte of the range, at odd offsets and length, and nothing outside it."""
    t = harness.transport
    n, loff, roff = (9 << 20) + 12_345, 4_099, 65_536 + 13
    src = pattern(n + loff, seed=3)
    src_region = t.register(src)
    done = t.wait(t.submit(write_job(src_region, harness.remote, n, local_offset=loff,
                                     remote_offset=roff)))
    assert (done.status, done.nbytes) == (TransferStatus.DONE, n)
    assert harness.remote_read(roff, n) == src[loff:loff + n].tobytes()
    assert harness.remote_read(roff - 1, 1) == b"\0" == harness.remote_read(roff + n, 1)
    dst = aligned(n + 8)
    dst_region = t.register(dst)
    back = t.wait(t.submit(write_job(dst_region, harness.remote, n, local_offset=5,
                                     remote_offset=roff, op=TransferOp.READ)))
    assert (back.status, back.nbytes) == (TransferStatus.DONE, n)
    assert dst[5:5 + n].tobytes() == src[loff:loff + n].tobytes()
    assert not dst[:5].any() and not dst[5 + n:].any()
    t.deregister(src_region)
    t.deregister(dst_region)


def test_many_jobs_in_flight_all_finish_once(harness):
    t = harness.transport
    chunk, jobs = 256 << 10, 8
    src = pattern(chunk * jobs, seed=2)
    region = t.register(src)
    ids = [
        t.submit(
            write_job(
                region, harness.remote, chunk, local_offset=i * chunk, remote_offset=i * chunk
            )
        )
        for i in range(jobs)
    ]
    assert len(set(ids)) == jobs
    seen = []
    for _ in range(100_000):
        seen += t.get_finished()
        if len(seen) == jobs:
            break
    assert sorted(r.job_id for r in seen) == sorted(ids)
    assert all(r.status is TransferStatus.DONE and r.nbytes == chunk for r in seen)
    assert harness.remote_read(0, chunk * jobs) == src.tobytes()
    assert t.get_finished() == []
    t.deregister(region)


def test_wait_takes_one_result_and_leaves_the_rest(harness):
    t = harness.transport
    src = pattern(8192, seed=3)
    region = t.register(src)
    first = t.submit(write_job(region, harness.remote, 4096))
    second = t.submit(
        write_job(region, harness.remote, 4096, local_offset=4096, remote_offset=4096)
    )
    assert t.wait(second).job_id == second
    rest = []
    for _ in range(100_000):
        rest += t.get_finished()
        if rest:
            break
    assert [r.job_id for r in rest] == [first]
    t.deregister(region)


def test_bad_jobs_are_refused_and_move_nothing(harness):
    t = harness.transport
    harness.remote_fill(REMOTE_BYTES - 4096, b"\x07" * 4096)
    src = pattern(8192, seed=4)
    region = t.register(src)
    bad = [
        write_job(region, harness.remote, 8192, remote_offset=REMOTE_BYTES - 4096),
        write_job(region, harness.remote, 4096, local_offset=8000),
        write_job(region, harness.remote, 0),
        write_job(region, harness.remote, 16, remote_offset=-1),
    ]
    for job in bad:
        with pytest.raises(InvalidTransfer):
            t.submit(job)
    assert harness.remote_read(REMOTE_BYTES - 4096, 4096) == b"\x07" * 4096
    assert t.get_finished() == []
    t.deregister(region)


def test_unregistered_or_foreign_regions_are_refused(harness):
    t = harness.transport
    src = pattern(4096, seed=5)
    region = t.register(src)
    t.deregister(region)
    with pytest.raises(InvalidTransfer):
        t.submit(write_job(region, harness.remote, 4096))
    live = t.register(src)
    stranger = Region(
        kind=harness.remote.kind,
        addr=harness.remote.addr,
        length=4096,
        device=harness.remote.device,
        owner="nobody-we-know",
    )
    with pytest.raises(UnknownPeer):
        t.submit(write_job(live, stranger, 4096))
    file_as_local = Region(kind=MemKind.FILE, addr=0, length=4096, device=0, owner=t.name)
    with pytest.raises(InvalidTransfer):
        t.submit(write_job(file_as_local, harness.remote, 4096))
    t.deregister(live)


def test_region_travels_as_bytes(harness):
    assert Region.unpack(harness.remote.pack()) == harness.remote
    with pytest.raises(InvalidTransfer):
        Region.unpack(b"\x93garbage")


def test_closed_transport_refuses_jobs(harness):
    t = harness.new_transport()
    src = pattern(4096, seed=6)
    region = t.register(src)
    t.close()
    with pytest.raises(TransportClosed):
        t.submit(write_job(region, region, 4096))


def test_registration_rejects_unusable_buffers(harness):
    t = harness.transport
    with pytest.raises(InvalidTransfer):
        t.register(np.zeros((64, 64), np.uint8)[:, ::2])  # not contiguous
    with pytest.raises(InvalidTransfer):
        t.register(np.zeros(0, np.uint8))
    with pytest.raises(InvalidTransfer):
        t.register(object())


def test_read_into_read_only_memory_is_refused(harness):
    t = harness.transport
    frozen = t.register(bytes(4096))  # a bytes object: readable, never writable
    with pytest.raises(InvalidTransfer):
        t.submit(write_job(frozen, harness.remote, 4096, op=TransferOp.READ))
    harness.remote_fill(0, b"\x05" * 4096)
    result = t.wait(t.submit(write_job(frozen, harness.remote, 4096)))  # reading from it is fine
    assert result.status is TransferStatus.DONE
    assert harness.remote_read(0, 4096) == bytes(4096)
    t.deregister(frozen)
