"""A tool start opens an idle gap for each of its session's pages in the live policy's
return model (tests/unit/service/).

The return model counts open gaps as "not returned yet": without them a long-silent page
looks as likely to return as ever (its reuse prior), and the cost-aware prefetch rule
prefetches pages whose peers are all still silent. Only closed outcomes were checked on
the service path (``returns.observed``); a strategy that opened no gap passed the unit
suite. Here twelve pages wait on a tool that never returns: a page of the same kind
silent for 30 s is rated below its reuse prior, because twelve peers are still silent."""

from __future__ import annotations

import copy

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.strategies import make_strategy
from tests.unit.service.test_controller import MB, meta


def _event(ctl: Controller, version: int, now: float, **data: object) -> list:
    event = ctl.events.translate("t", "a", {"event_id": version, "task_id": "x",
                                            "version": version, "ts": now, **data})
    return ctl.apply(event, now)


def test_pages_waiting_on_a_tool_count_as_not_yet_returned() -> None:
    ctl = Controller(make_strategy("agentkv"))
    ctl.add_hbm("h", 64 * MB)  # roomy: no gap moves, only the model's bookkeeping
    ctl.table.open_session("t", "a")
    out, _ = ctl.admit("t", "a", [meta("a", i, StateType.EVIDENCE) for i in range(12)], 0.0)
    ctl.ingested([g for g, _ in out])
    _event(ctl, 1, 0.1, kind="task_start", prefix_generation=1, prefix_pages=[],
           input_pages=list(range(12)))
    _event(ctl, 2, 0.2, kind="tool_start", call_id="k1", tool="crawl")
    returns = ctl.table.hbms["h"].policy.returns
    # Another page of the same kind (tool class, type), silent since 30 s: every one of the
    # twelve began its gap before that and none has returned by 60 s.
    late = copy.copy(ctl.table.pages[out[0][0]].view)
    late.page_id, late.last_access = 10_000, 30.0
    assert returns.p_return(late, 60.0) < 0.8 * late.reuse_prob
