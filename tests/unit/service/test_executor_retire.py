"""A retired page's pool copies and directory entry go even when its HBM actor does not
answer the drop: the deletion ran the pool's delete only after the HBM drop succeeded, so
a dead or starved HBM actor left the retired page's copies (sealed, listed) in the pool
until its tenant was erased (found by review). Pure: no Ray."""

from __future__ import annotations

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.executor import Executor
from agentkv_cluster.runtime.guard import Guarded
from agentkv_cluster.runtime.handles import ActorGone
from agentkv_cluster.runtime.link_credits import LinkCredits
from agentkv_cluster.runtime.records import Action, ActionKind, Outcome, Reason
from agentkv_cluster.runtime.strategies import make_strategy
from tests.unit.service.test_controller import MB


class _DeadHbm:
    def drop(self, key: bytes) -> None:
        raise ActorGone("RayActorError: the HBM actor died")


class _Pool:
    def __init__(self) -> None:
        self.deleted: list[tuple[bytes, str]] = []

    def delete(self, key: bytes, namespace: str) -> int:
        self.deleted.append((key, namespace))
        return 1


def test_a_retired_page_leaves_the_pool_though_its_hbm_actor_is_gone() -> None:
    ctl = Guarded(Controller(make_strategy("lru")))
    ctl.add_hbm("h", 2 * MB)
    pool = _Pool()
    ex = Executor(ctl, {"h": _DeadHbm()}, {"p": pool}, {"h": "p"}, LinkCredits(4, 2),
                  landing_pages=0)
    retire = Action(kind=ActionKind.DELETE, gid=7, hbm="h", reason=Reason.RETIRE,
                    tenant="acme", key=b"k", pool="p")
    try:
        (result,) = ex.run([retire])
    finally:
        ex.close()
    assert pool.deleted == [(b"k", "acme")]
    assert result.outcome is Outcome.ACTOR_GONE  # still reported: the HBM copy's fate
