"""A ``store_pages`` answers only for pages that outlived the HBM actor that took them.

The API front stages a call's pages chunk by chunk, and each chunk lands in the HBM actor
the session is placed on at that moment (the controller's ``store`` names the actors that
took bytes). When that actor dies between two chunks, the controller's watcher moves the
session to another actor and the later chunks land there, while the earlier ones died with
the first: a reply naming them would be contradicted by ``page_lost`` at their first load.
So once every chunk landed, ``store_held`` looks at the actors the chunks named (``judge``,
pure); when there were several, the call is stored again: the controller admits again
only the pages that have no copy left (``Controller.admit`` skips the ones resident or on
their way in), on the actor the session moved to, from the bytes the front still holds.
The check costs no call.

A death after the last chunk landed is a loss like any later one: the page answers
``page_lost`` at its next load. (Pinging the actor before the reply would narrow that
window by a few milliseconds at the price of a round trip on every store: about 0.9 ms,
a tenth of a one-page store, on the 2-core box.) A store whose pages did not land in one
actor in ``STORE_ATTEMPTS`` runs is refused as ``page_lost``: none of its keys is to be
relied on.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from agentkv_cluster.api.errors import PageLost
from agentkv_cluster.runtime.handles import ActorGone, ActorSlow

STORE_ATTEMPTS = 3  # runs of one call's store, the first included


class Survival(enum.Enum):
    HELD = "held"  # one HBM actor took every chunk (or none had to)
    MOVED = "moved"  # the session moved to another HBM actor while the chunks landed


def judge(took: set[str]) -> Survival:
    """``took``: the HBM actors the chunks of one call landed in."""
    return Survival.MOVED if len(took) > 1 else Survival.HELD


def store_held(store: Callable[[], set[str]], controller: Callable[[], object],
               attempts: int = STORE_ATTEMPTS) -> int:
    """Run ``store`` (every chunk of one call; returns the HBM actors its pages landed in)
    until its pages landed in one actor; returns how many runs it took. A run that failed
    because its HBM actor died (``ActorGone``: the controller forgot the actor already) is
    run again; a slow one (``ActorSlow``) is raised. ``controller()`` raises ``ActorGone``
    if the controller itself is gone. Raises ``PageLost`` after ``attempts`` runs in
    vain."""
    for attempt in range(1, attempts + 1):
        try:
            took = store()
        except ActorSlow:
            raise
        except ActorGone:
            continue
        if judge(took) is Survival.HELD:
            return attempt
    controller()  # a dead controller is raised as itself: then no HBM actor was to blame
    raise PageLost(f"the HBM actors holding this store's pages died {attempts} times while "
                   "it ran: none of its pages may be relied on; store them again")
