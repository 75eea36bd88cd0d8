"""Page state machine: every legal and illegal transition, and nothing changes on error."""

from __future__ import annotations

import itertools

import pytest

from agentkv_cluster.lifecycle.state_machine import (
    IllegalTransition,
    NotRetirable,
    PageStateMachine,
    UnknownPage,
    transition,
)
from agentkv_cluster.lifecycle.types import PageId, PageState

A, F, C, R, M, X = (PageState.ACTIVE, PageState.FROZEN, PageState.COMPRESSED,
                    PageState.RESTORING, PageState.COMMITTED, PageState.RETIRED)
# Fig. 2, written out independently of the module's table
EXPECTED_LEGAL = {
    (A, F), (A, M), (A, X),
    (F, A), (F, C), (F, X),
    (C, R), (C, X),
    (R, A), (R, C),
    (M, C), (M, X),
}
ALL_PAIRS = list(itertools.product(PageState, PageState))
ILLEGAL = [p for p in ALL_PAIRS if p not in EXPECTED_LEGAL]


def test_pair_counts() -> None:
    assert len(ALL_PAIRS) == 36 and len(ILLEGAL) == 24


@pytest.mark.parametrize(("src", "dst"), sorted(EXPECTED_LEGAL, key=str))
def test_legal_transition(src: PageState, dst: PageState) -> None:
    assert transition(src, dst) is dst
    sm = PageStateMachine()
    sm.add(PageId(1), src)
    assert sm.move(PageId(1), dst, retirable=True) is dst
    assert sm.state(PageId(1)) is dst


@pytest.mark.parametrize(("src", "dst"), ILLEGAL)
def test_illegal_transition_raises_and_changes_nothing(src: PageState, dst: PageState) -> None:
    with pytest.raises(IllegalTransition, match=f"{src.value} -> {dst.value}"):
        transition(src, dst)
    sm = PageStateMachine()
    if src is X:  # a page cannot start retired: reach it the legal way
        sm.add(PageId(1), A)
        sm.move(PageId(1), X, retirable=True)
    else:
        sm.add(PageId(1), src)
    sm.add(PageId(2), A)
    with pytest.raises(IllegalTransition):
        sm.move(PageId(1), dst, retirable=True)
    assert (sm.state(PageId(1)), sm.state(PageId(2)), len(sm)) == (src, A, 2)


def test_fig2_cycle() -> None:
    sm = PageStateMachine()
    sm.add(PageId(7))
    path = [F, C, R, A, M, C, R, C]
    assert [sm.move(PageId(7), s) for s in path] == path


@pytest.mark.parametrize("src", [A, F, C, M])
def test_retire_needs_graph_consent(src: PageState) -> None:
    sm = PageStateMachine()
    sm.add(PageId(3), src)
    with pytest.raises(NotRetirable):
        sm.move(PageId(3), X)
    assert sm.state(PageId(3)) is src
    assert sm.move(PageId(3), X, retirable=True) is X


def test_retired_is_terminal_and_forgettable() -> None:
    sm = PageStateMachine()
    sm.add(PageId(4))
    with pytest.raises(IllegalTransition, match="not retired"):
        sm.forget(PageId(4))
    sm.move(PageId(4), X, retirable=True)
    for to in PageState:
        with pytest.raises(IllegalTransition):
            sm.move(PageId(4), to, retirable=True)
    sm.forget(PageId(4))
    assert len(sm) == 0
    with pytest.raises(UnknownPage):
        sm.state(PageId(4))


def test_add_rejects_duplicates_and_retired_start() -> None:
    sm = PageStateMachine()
    sm.add(PageId(5), F)
    with pytest.raises(IllegalTransition, match="already tracked"):
        sm.add(PageId(5))
    with pytest.raises(IllegalTransition, match="cannot start retired"):
        sm.add(PageId(6), X)
    assert (len(sm), sm.state(PageId(5))) == (1, F)


def test_unknown_page() -> None:
    with pytest.raises(UnknownPage):
        PageStateMachine().move(PageId(9), F)
