"""NIXL UCX between two processes on one host moves bulk bytes one-sided (CMA zero-copy):
a write or read is done when ``submit`` returns, on the submitting thread, without waiting
for either progress thread. Control: with TCP as the only transport the same jobs are
mostly still in flight at submit (they need the peer's progress thread), so the check can
fail (a UCX setting or module list that drops CMA would fail it)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from store.transport import TransferJob, TransferOp, nixl_available

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not nixl_available(), reason="NIXL is not installed"),
]
SIZE = 4 << 20
TRIES = 9


def _done_at_submit(tls: str | None) -> tuple[int, int]:
    """(writes, reads) of TRIES each that were finished when submit returned."""
    from store.transport.nixl_ucx import NixlUcxTransport
    from store.transport.peer import PeerProcess

    saved = os.environ.get("UCX_TLS")
    if tls is None:
        os.environ.pop("UCX_TLS", None)
    else:
        os.environ["UCX_TLS"] = tls  # read when the agent's UCX context is created
    try:
        transport = NixlUcxTransport()
        peer = PeerProcess(transport, SIZE)
    finally:
        if saved is None:
            os.environ.pop("UCX_TLS", None)
        else:
            os.environ["UCX_TLS"] = saved
    try:
        src = np.random.default_rng(5).integers(0, 256, SIZE, dtype=np.uint8)
        dst = np.zeros(SIZE, np.uint8)
        regions = {TransferOp.WRITE: transport.register(src),
                   TransferOp.READ: transport.register(dst)}
        counts = []
        for op in (TransferOp.WRITE, TransferOp.READ):
            done = 0
            for _ in range(TRIES):
                job = transport.submit(TransferJob(op=op, local=regions[op], remote=peer.region,
                                                   length=SIZE))
                finished = {r.job_id for r in transport.get_finished()}
                done += job in finished
                if job not in finished:
                    transport.wait(job)
            counts.append(done)
        assert peer.read(0, SIZE) == src.tobytes() and dst.tobytes() == src.tobytes()
        return counts[0], counts[1]
    finally:
        peer.close()
        transport.close()


def test_same_host_moves_finish_in_submit_without_the_progress_thread():
    default = _done_at_submit(None)
    tcp_only = _done_at_submit("tcp,self")
    assert min(default) > TRIES // 2, (default, tcp_only)  # one-sided: done in submit
    assert max(tcp_only) <= TRIES // 2, (default, tcp_only)  # control: the check can fail
