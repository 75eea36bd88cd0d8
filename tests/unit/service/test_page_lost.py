"""A load the service cannot serve through no fault of its caller is refused as
``page_lost``, typed end to end (pure: no Ray, no sockets).

Pages with no copy left, and pages whose restore failed, used to be refused as a plain
``RequestRefused`` whose message began with "PageLost", and reached the client as
``bad_args``: a platform could not tell "you sent garbage" from "the service lost your
page, recompute it"."""

from __future__ import annotations

import time

import pytest

from agentkv_cluster.api import protocol as p
from agentkv_cluster.api.errors import PageLost, ServiceError
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.guard import Guarded
from agentkv_cluster.runtime.loads import EngineLoader, RefusedPageLost
from agentkv_cluster.runtime.records import (
    Action,
    ActionKind,
    Outcome,
    RequestRefused,
    TransferResult,
)
from agentkv_cluster.runtime.strategies import make_strategy
from store.types import Codec, Tier
from tests.unit.service.test_controller import MB, admitted, done


class _Worker:
    """The transfer worker as the loader uses it; every restore ends as ``restores`` says."""

    def __init__(self, ctl: Guarded, restores: Outcome) -> None:
        self.ctl, self.restores = ctl, restores

    def abandon_queued(self, gids: list[int]) -> int:
        return 0

    def run(self, actions: list[Action]) -> list[TransferResult]:
        results = [TransferResult(action=a, outcome=self.restores, error="IntegrityError: x")
                   if a.kind is ActionKind.RESTORE and self.restores is not Outcome.DONE
                   else done(a, source="host") for a in actions]
        for r in results:
            self.ctl.finished(r, time.monotonic())
        return results


def _one_page_in_the_pool() -> tuple[Guarded, int]:
    """Session ``a``'s one page, its HBM copy gone and one FULL copy in the host pool."""
    ctl = Guarded(Controller(make_strategy("lru")))
    ctl.add_hbm("h", 8 * MB)
    admitted(ctl, "a", range(1), 0.0)
    (gid,) = ctl.table.resolve("t", "a", [b"a/0"])
    rec = ctl.manager.table.pages[gid]
    ctl.manager.table.evict(rec, tracked=True)
    rec.copies, rec.pool = {Codec.FULL: Tier.HOST}, "p"
    return ctl, gid


def test_a_page_with_no_copy_left_is_refused_as_page_lost_and_nothing_stays_pinned() -> None:
    ctl, gid = _one_page_in_the_pool()
    ctl.manager.table.pages[gid].copies = {}  # its pool died with the only copy
    loader = EngineLoader(ctl, _Worker(ctl, Outcome.DONE), check=lambda results: None)
    with pytest.raises(RefusedPageLost, match="no copy left"):
        loader.load("t", "a", [b"a/0"])
    assert ctl.manager.table.pages[gid].pins == 0
    assert loader.recompute_tokens == {"t": 16}


@pytest.mark.parametrize("outcome", [Outcome.FAILED, Outcome.ACTOR_GONE])
def test_a_page_whose_restore_failed_is_refused_as_page_lost(outcome: Outcome) -> None:
    """A failed restore, or two in a row whose actor died, was ``bad_args``."""
    ctl, gid = _one_page_in_the_pool()
    loader = EngineLoader(ctl, _Worker(ctl, outcome), check=lambda results: None)
    with pytest.raises(RefusedPageLost, match="could not be restored"):
        loader.load("t", "a", [b"a/0"])
    assert ctl.manager.table.pages[gid].pins == 0


def test_the_refusal_is_still_a_request_refusal_and_the_api_error_is_page_lost() -> None:
    """Handlers of refusals (an erasure meanwhile, a session closed meanwhile) see it as
    before; the wire code is its own, not ``bad_args``."""
    assert issubclass(RefusedPageLost, RequestRefused)
    assert issubclass(PageLost, ServiceError) and PageLost.code is p.ErrorCode.PAGE_LOST
    assert p.ErrorCode.PAGE_LOST.value == "page_lost"


def test_a_page_lost_reply_raises_a_remote_error_of_its_own_class() -> None:
    frame = p.error_reply(4, p.ErrorCode.PAGE_LOST, "PageLost: 1 page(s) have no copy left")
    with pytest.raises(p.PageLostError) as info:
        p.decode_reply(frame[4:])
    assert isinstance(info.value, p.RemoteError)  # what clients already catch
    assert (info.value.code, info.value.message) == (
        "page_lost", "PageLost: 1 page(s) have no copy left")


def test_a_code_this_client_does_not_know_is_a_plain_remote_error_with_its_code() -> None:
    """What an older client does with ``page_lost``, and this one with a newer code."""
    frame = p.pack_frame({"v": 1, "id": 5, "ok": False,
                          "error": {"code": "some_future_code", "message": "m"}})
    with pytest.raises(p.RemoteError) as info:
        p.decode_reply(frame[4:])
    assert type(info.value) is p.RemoteError and info.value.code == "some_future_code"
