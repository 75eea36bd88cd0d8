"""The move schedule: start-time order, ties in push order, cancel by page and kind."""

from __future__ import annotations

from agentkv_cluster.runtime.records import Action, ActionKind, Reason
from agentkv_cluster.runtime.schedule import MoveSchedule
from store.types import Codec, Tier


def move(gid: int, kind: ActionKind, at: float) -> Action:
    return Action(kind=kind, gid=gid, hbm="h", tier=Tier.HOST, codec=Codec.FULL,
                  start_at=at, reason=Reason.GAP, session="s")


def test_due_moves_come_out_earliest_first_and_ties_in_push_order() -> None:
    sched = MoveSchedule()
    for gid, at in [(1, 2.0), (2, 1.0), (3, 1.0), (4, 5.0)]:
        sched.push(move(gid, ActionKind.DEMOTE, at))
    assert sched.next_due() == 1.0
    assert [a.gid for a in sched.pop_due(2.0)] == [2, 3, 1]
    assert len(sched) == 1 and sched.next_due() == 5.0
    assert list(sched.pop_due(4.9)) == []


def test_a_move_pushed_back_while_draining_waits_for_its_new_time() -> None:
    sched = MoveSchedule()
    sched.push(move(1, ActionKind.RESTORE, 1.0))
    seen = []
    for action in sched.pop_due(1.0):
        seen.append(action.gid)
        sched.push(action, at=1.02)  # as ``Controller.due`` recalls a page still moving
    assert seen == [1] and [(at, a.gid) for at, a in sched] == [(1.02, 1)]


def test_cancel_drops_only_the_given_pages_and_kinds() -> None:
    sched = MoveSchedule()
    sched.push(move(1, ActionKind.DEMOTE, 1.0))
    sched.push(move(1, ActionKind.RESTORE, 2.0))
    sched.push(move(2, ActionKind.DEMOTE, 3.0))
    assert sched.cancel([1]) == 1  # demotions by default
    assert sorted((a.gid, a.kind.value) for _, a in sched) == [(1, "restore"), (2, "demote")]
    assert sched.cancel([1, 2], kinds=(ActionKind.DEMOTE, ActionKind.RESTORE)) == 2
    assert len(sched) == 0 and sched.next_due() is None
