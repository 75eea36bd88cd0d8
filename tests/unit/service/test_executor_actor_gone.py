"""A restore into an HBM actor the controller forgot meanwhile (it died mid-load) is
reported as ``ACTOR_GONE``, so the load retries it on the HBM actor its session moved to,
not ``FAILED`` (refused to the engine as bad input). Pure: no Ray."""

from __future__ import annotations

from agentkv_cluster.runtime.records import ActionKind, Outcome
from tests.unit.service.test_controller import admitted, finish
from tests.unit.service.test_executor_take_back import _worker


def test_a_restore_into_a_forgotten_hbm_actor_is_the_dead_actors() -> None:
    ctl, ex, hbm = _worker()
    try:
        finish(ctl.manager, admitted(ctl.manager, "c", range(1), 1.0), 1.0)  # a/0 pushed out
        (a0,) = ctl.table.resolve("t", "a", [b"a/0"])
        demotes, restores, _lost, _blocked = ctl.access([a0], 2.0)
        ex.run(demotes)
        assert [r.kind for r in restores] == [ActionKind.RESTORE]
        del ex.hbms["h"]  # the watcher forgot the dead HBM actor while the load ran
        (result,) = ex.run(restores)
    finally:
        ex.close()
    assert result.outcome is Outcome.ACTOR_GONE, result
    assert ("restore", b"a/0") not in hbm.calls
