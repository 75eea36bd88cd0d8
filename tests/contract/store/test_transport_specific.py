"""What only some transports promise, beyond the shared contract
(``test_transport_contract.py``): NIXL UCX lanes and notification tags, and moves from
GPU memory (marked ``gpu``: skipped where no CUDA device is present)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from store.transport import LocalCopyTransport, MemKind, TransferJob, TransferOp, TransferStatus
from tests.contract.store.test_transport_contract import (
    UcxHarness,
    aligned,
    needs_nixl,
    pattern,
    write_job,
)


@pytest.fixture(scope="module")
def ucx():
    harness = UcxHarness()
    yield harness
    harness.close()


def _notifications(harness: UcxHarness, wait_s: float = 20.0) -> list[bytes]:
    """Tags the peer was notified of by this harness's transport (polls until one came)."""
    got: list[bytes] = []
    deadline = time.monotonic() + wait_s
    while not got and time.monotonic() < deadline:
        got += harness.peer.notifications().get(harness.transport.name, [])
        time.sleep(0.01)
    return got


@needs_nixl
def test_ucx_splits_large_jobs_across_lanes_and_a_tagged_job_lands_before_its_tag(ucx):
    t = ucx.transport
    n = 8 << 20
    src = pattern(n, seed=11)
    region = t.register(src)
    job = write_job(region, ucx.remote, n)
    assert t.wait(t.submit(job)).status is TransferStatus.DONE
    assert t.lanes_in_use == 2  # the second lane's agent started for this job
    assert ucx.remote_read(0, n) == src.tobytes()
    src2 = pattern(n, seed=12)
    region2 = t.register(src2)  # registered with both lanes
    tagged = TransferJob(op=TransferOp.WRITE, local=region2, remote=ucx.remote,
                         length=n, tag=b"whole")
    assert t.wait(t.submit(tagged)).status is TransferStatus.DONE
    got = _notifications(ucx)
    assert got == [b"whole"]  # one notification, from the job's one transfer
    assert ucx.remote_read(0, n) == src2.tobytes()
    t.deregister(region)
    t.deregister(region2)


@needs_nixl
def test_ucx_job_tags_reach_the_peer(ucx):
    t = ucx.transport
    src = pattern(4096, seed=7)
    region = t.register(src)
    job = TransferJob(
        op=TransferOp.WRITE, local=region, remote=ucx.remote, length=4096, tag=b"page-42"
    )
    assert t.wait(t.submit(job)).status is TransferStatus.DONE
    got = _notifications(ucx)
    assert got == [b"page-42"]
    t.deregister(region)


@pytest.mark.gpu
def test_local_copy_moves_between_vram_and_dram():
    import torch

    t = LocalCopyTransport()
    gpu = torch.arange(4096, dtype=torch.int32, device="cuda") % 251
    host = aligned(gpu.numel() * 4)
    vram, dram = t.register(gpu), t.register(host)
    assert vram.kind is MemKind.VRAM
    job = TransferJob(op=TransferOp.READ, local=dram, remote=vram, length=host.nbytes)
    assert t.wait(t.submit(job)).status is TransferStatus.DONE
    assert host.view(np.int32).tolist() == gpu.cpu().tolist()
    t.close()


@pytest.mark.gpu
@needs_nixl
def test_ucx_moves_vram_into_another_process(ucx):
    import torch

    t = ucx.transport
    gpu = (torch.arange(1 << 20, device="cuda") % 251).to(torch.uint8)
    region = t.register(gpu)
    assert region.kind is MemKind.VRAM
    job = TransferJob(
        op=TransferOp.WRITE, local=region, remote=ucx.remote, length=gpu.numel()
    )
    assert t.wait(t.submit(job)).status is TransferStatus.DONE
    assert ucx.remote_read(0, gpu.numel()) == gpu.cpu().numpy().tobytes()
    t.deregister(region)
