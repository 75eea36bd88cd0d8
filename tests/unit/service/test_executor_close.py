"""A transfer worker that was closed (the service is stopping) refuses new foreground
work with ``ServiceStopping`` (the API's ``busy``), not the thread pool's RuntimeError
(``internal``), and starts no background work (pure: no Ray)."""

from __future__ import annotations

import pytest

from agentkv_cluster.runtime.guard import ServiceStopping
from agentkv_cluster.runtime.records import ActionKind
from tests.unit.service.test_controller import admitted
from tests.unit.service.test_executor_take_back import _worker


def test_a_closed_worker_refuses_moves_as_stopping() -> None:
    ctl, ex, hbm = _worker()
    (pressure,) = admitted(ctl.manager, "b", range(1), 1.0)
    assert pressure.kind is ActionKind.DEMOTE
    ex.close()
    with pytest.raises(ServiceStopping, match="stopping"):
        ex.run([pressure])
    ex.submit([pressure])  # nothing starts, nothing raises
    assert hbm.calls == []
