"""A move that ends after its HBM actor died: the page's session lives on another HBM
actor by then, and the dead actor's failure must not charge that one (pure, no Ray).

A pressure demotion out of a dying HBM actor failed; the manager "kept" the page as
resident on the actor its session had moved to, where its bytes never were: that budget
held a phantom page (seen over budget after a node left under a burst of loads), and the
page, its only copy gone, was reported resident instead of lost."""

from __future__ import annotations

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.records import ActionKind, Outcome, TransferResult
from agentkv_cluster.runtime.strategies import make_strategy
from tests.unit.service.test_controller import MB, admitted, finish


def test_a_failed_demotion_out_of_a_dead_hbm_actor_keeps_nothing_elsewhere() -> None:
    ctl = Controller(make_strategy("lru"))
    ctl.add_hbm("h0", 2 * MB, "p0")
    ctl.add_hbm("h1", 2 * MB, "p1")
    ctl.table.open_session("t", "other")  # h0 takes the first session, h1 this one
    finish(ctl, admitted(ctl, "s", range(2), 0.0), 0.0)
    assert ctl.table.session("t", "s").hbm == "h1"
    (pressure,) = admitted(ctl, "s", range(2, 3), 1.0)  # s/0 leaves h1
    assert pressure.kind is ActionKind.DEMOTE and pressure.hbm == "h1"
    lost = ctl.remove_hbm("h1")  # dies mid-copy: the session moves to h0
    assert ctl.table.session("t", "s").hbm == "h0"
    assert pressure.gid in lost
    ctl.finished(TransferResult(action=pressure, outcome=Outcome.ACTOR_GONE), 2.0)
    rec = ctl.table.pages[pressure.gid]
    assert not rec.resident  # its bytes died with h1: lost, never served from h0
    assert ctl.table.hbm_used()["h0"] == 0
