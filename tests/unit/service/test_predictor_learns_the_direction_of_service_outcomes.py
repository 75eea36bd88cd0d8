"""The reuse predictor (eq. 2) learns *what* the service observes, and its predictions
reach the pages the policy ranks (tests/unit/service/).

``test_controller_paper`` counts the outcomes the service feeds the predictor; a service
that fed every outcome with the wrong label, or whose predictions never reached the page
records, passed the unit service suite. Here pages of one type that are always read
again raise the predicted reuse of the next page of that type above its Table 1 prior,
and pages that always retire unread lower it."""

from __future__ import annotations

from agentkv_cluster.lifecycle.types import TYPE_DEFAULTS, StateType
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.strategies import make_strategy
from tests.unit.service.test_controller import MB, meta

KIND = StateType.TOOL_OBSERVATION
PRIOR = TYPE_DEFAULTS[KIND].reuse_prob


def _new_page(ctl: Controller, pid: int, now: float):
    out, _ = ctl.admit("t", "s", [meta("s", pid, KIND)], now)
    ctl.ingested([g for g, _ in out])
    return ctl.table.pages[out[0][0]]


def _trained(read_again: bool) -> tuple[Controller, float]:
    """60 pages, each read again (or retired unread, by closing its own session) after
    1 s; returns the controller and the reuse the next new page is given."""
    ctl = Controller(make_strategy("agentkv"))
    ctl.add_hbm("h", 4096 * MB)
    now = 0.0
    for i in range(60):
        session = f"s{i}"
        ctl.table.open_session("t", session)
        out, _ = ctl.admit("t", session, [meta(session, 0, KIND)], now)
        ctl.ingested([g for g, _ in out])
        gid = out[0][0]
        now += 1.0
        if read_again:
            ctl.access([gid], now)  # read again: a positive outcome
            ctl.table.unpin([gid], now)
        else:
            ctl.events.close_session("t", session, now)  # gone unread: a negative one
    ctl.table.open_session("t", "s")
    return ctl, _new_page(ctl, 1000, now).view.reuse_prob


def test_pages_always_read_again_raise_the_next_pages_predicted_reuse() -> None:
    ctl, reuse = _trained(read_again=True)
    assert ctl.strategy.calibration().outcomes == 60
    assert reuse > PRIOR + 0.02


def test_pages_always_retired_unread_lower_the_next_pages_predicted_reuse() -> None:
    ctl, reuse = _trained(read_again=False)
    assert ctl.strategy.calibration().outcomes == 60
    assert reuse < PRIOR - 0.02
