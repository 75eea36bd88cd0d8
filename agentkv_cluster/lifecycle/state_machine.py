"""Page state machine (Fig. 2): active -> frozen -> compressed -> restoring -> active.

Committed and retired are the exits. Retirement additionally needs the event
graph's consent (``EventGraph.is_retirable``), which the caller passes in.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from agentkv_cluster.lifecycle.types import PageId, PageState, UnknownPage

_S = PageState

LEGAL: Mapping[PageState, frozenset[PageState]] = MappingProxyType(
    {
        # a tool call freezes the page; verification commits it
        _S.ACTIVE: frozenset({_S.FROZEN, _S.COMMITTED, _S.RETIRED}),
        # an early tool return re-activates a frozen page without any move
        _S.FROZEN: frozenset({_S.ACTIVE, _S.COMPRESSED, _S.RETIRED}),
        _S.COMPRESSED: frozenset({_S.RESTORING, _S.RETIRED}),
        # a cancelled or failed restore falls back to the compressed copy
        _S.RESTORING: frozenset({_S.ACTIVE, _S.COMPRESSED}),
        # a committed page may still be demoted (a reference copy stays) and retired
        _S.COMMITTED: frozenset({_S.COMPRESSED, _S.RETIRED}),
        _S.RETIRED: frozenset(),
    }
)


class IllegalTransition(ValueError):
    """A page state change Fig. 2 does not allow; nothing was changed."""


class NotRetirable(IllegalTransition):
    """The event graph still needs the page."""


def transition(current: PageState, to: PageState) -> PageState:
    """Return ``to`` if ``current -> to`` is legal, else raise ``IllegalTransition``."""
    if to not in LEGAL[current]:
        raise IllegalTransition(f"{current.value} -> {to.value} is not allowed")
    return to


class PageStateMachine:
    """Current state of every tracked page; illegal changes raise and change nothing."""

    def __init__(self) -> None:
        self._states: dict[PageId, PageState] = {}

    def add(self, page: PageId, state: PageState = PageState.ACTIVE) -> None:
        if page in self._states:
            raise IllegalTransition(f"page {page} is already tracked")
        if state is PageState.RETIRED:
            raise IllegalTransition("a page cannot start retired")
        self._states[page] = state

    def state(self, page: PageId) -> PageState:
        try:
            return self._states[page]
        except KeyError:
            raise UnknownPage(f"page {page} is not tracked") from None

    def move(self, page: PageId, to: PageState, *, retirable: bool = False) -> PageState:
        """Change a page's state. ``retirable`` is the graph's verdict, needed for RETIRED."""
        new = transition(self.state(page), to)
        if new is PageState.RETIRED and not retirable:
            raise NotRetirable(f"page {page} is still needed by the event graph")
        self._states[page] = new
        return new

    def forget(self, page: PageId) -> None:
        """Drop a retired page's record."""
        if self.state(page) is not PageState.RETIRED:
            raise IllegalTransition(f"page {page} is not retired")
        del self._states[page]

    def __len__(self) -> int:
        return len(self._states)
