"""``Service.stop`` while a load waits for room: the load is refused at once (``busy``),
stop does not sit out the load's deadline, and the host pool's segment goes.

Local mode (no Ray): the wait is the controller's own, the same on Ray.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.lifecycle.identity import PageIdentity
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration

PAGE = 1 << 17
TOKENS, L, H, D = 128, 2, 2, 64  # 2*L*H*TOKENS*D fp16 values: 128 KiB, one arena page


def page(pid: int, session: str) -> dict:
    ident = PageIdentity(model_version="m1", adapter_version="", tokenizer_version="t1",
                         rope_config="theta=1e4", tenant="acme", session=session,
                         start=1000 * pid, end=1000 * pid + TOKENS, event_version=1)
    data = np.random.default_rng(pid).standard_normal(2 * L * H * TOKENS * D,
                                                      dtype=np.float32).astype(np.float16)
    return {"page_id": pid, "identity": ident.pack(), "state_type": "evidence",
            "data": data.tobytes(), "shape": [L, H, TOKENS, D]}


def test_stop_refuses_a_load_waiting_for_room_instead_of_waiting_it_out() -> None:
    # A budget of 4 pages, all pinned by a load never released (for 30 s: pin_timeout_s).
    with local_service("akv-stop-", page_bytes=PAGE, hbm_pages=16, pool_bytes=16 * PAGE,
                       hbm_capacity=4 * PAGE) as svc:
        segment = Path("/dev/shm") / next(iter(svc.topo.pool_specs.values())).shm_name
        waiter = svc.client("acme").open_session("waiter")
        keys = waiter.store_pages([page(i, "waiter") for i in range(2)])
        holder = svc.client("acme").open_session("holder")
        held = holder.store_pages([page(10 + i, "holder") for i in range(4)])
        holder.prepare_load(held)  # its pins fill the budget and are never released
        outcome: list[object] = []
        started = threading.Event()

        def load() -> None:
            started.set()
            try:
                outcome.append(waiter.prepare_load(keys))
            except (RemoteError, ConnectionError) as exc:
                outcome.append(exc)

        thread = threading.Thread(target=load, daemon=True)
        thread.start()
        started.wait(10)
        thread.join(0.5)  # the load is now blocked for room (or soon will be)
        assert thread.is_alive(), f"the load did not wait for room: {outcome}"
        assert segment.exists()
        svc.stop()
        thread.join(120)  # a deadline only: the refusal comes at once
        assert not thread.is_alive()
        (got,) = outcome
        assert isinstance(got, RemoteError) and got.code == "busy", got
        assert "stopping" in got.message
        assert not segment.exists()  # the host pool's shared memory went with the service
