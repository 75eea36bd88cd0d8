"""A ``store_pages`` answers only for pages that outlived the HBM actor that took them.

The API front stages a call's pages chunk by chunk, and each chunk lands in the HBM actor
the session is placed on at that moment (the controller's ``store`` names it). That actor
may die before the reply: between two chunks (the controller's watcher then moves the
session to another actor, and the later chunks land there) or after the last chunk landed
(nobody has noticed yet). Pages that died with it have no copy left; a reply naming them
would be contradicted by ``page_lost`` at their first load. So, once every chunk landed,
``store_held`` looks at the actors the chunks named and pings the one that took them;
``judge`` (pure) says whether every page is held. If not, the call is stored again: the
controller admits again only the pages that have no copy left (``Controller.admit`` skips
the ones resident or on their way in), on the actor the session moved to, from the bytes
the front still holds. The check costs one ping of an actor per call (in the actor's own
concurrency group, so it never queues behind page work).

A death after the check is a loss like any later one: the page answers ``page_lost`` at
its next load. A store whose pages did not survive ``STORE_ATTEMPTS`` runs is refused as
``page_lost``: none of its keys is to be relied on.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping

from agentkv_cluster.api.errors import PageLost
from agentkv_cluster.runtime.actor_watch import DEATH_PING_S, Liveness, liveness
from agentkv_cluster.runtime.handles import ActorGone, ActorHandle, ActorSlow

STORE_ATTEMPTS = 3  # runs of one call's store, the first included


class Survival(enum.Enum):
    HELD = "held"  # one HBM actor took every chunk and still answers
    MOVED = "moved"  # the session moved to another HBM actor while the chunks landed
    DIED = "died"  # the HBM actor that took every chunk is dead (the controller may not know)


def judge(took: set[str], seen: Liveness) -> Survival:
    """``took``: the HBM actors the chunks of one call landed in; ``seen``: a ping of the
    one actor that took them all (ignored otherwise). A slow answer counts as alive: a
    busy actor is the watcher's to judge (it forgets one only after several missed
    pings)."""
    if len(took) > 1:
        return Survival.MOVED
    if seen is Liveness.GONE:
        return Survival.DIED
    return Survival.HELD


def store_held(store: Callable[[], set[str]], hbms: Mapping[str, ActorHandle],
               forget: Callable[[str], object], controller: Callable[[], object],
               attempts: int = STORE_ATTEMPTS) -> int:
    """Run ``store`` (every chunk of one call; returns the HBM actors its pages landed in)
    until its pages are held; returns how many runs it took. ``hbms``: the HBM actors by
    name (pinged, waiting ``DEATH_PING_S`` at most); ``forget(name)``: the controller
    forgets a dead HBM actor (its sessions move to another one); ``controller()``: raises
    ``ActorGone`` if the controller itself is gone. A run that failed because
    its HBM actor died (``ActorGone``: the controller forgot the actor already) is run
    again; a slow one (``ActorSlow``) is raised. Raises ``PageLost`` after ``attempts``
    runs in vain."""
    for attempt in range(1, attempts + 1):
        try:
            took = store()
        except ActorSlow:
            raise
        except ActorGone:
            continue
        one = next(iter(took)) if len(took) == 1 else None
        seen = liveness(hbms[one], DEATH_PING_S) if one in hbms else Liveness.ALIVE
        verdict = judge(took, seen)
        if verdict is Survival.HELD:
            return attempt
        if verdict is Survival.DIED:
            forget(one)
    controller()  # a dead controller is raised as itself: then no HBM actor was to blame
    raise PageLost(f"the HBM actors holding this store's pages died {attempts} times while "
                   "it ran: none of its pages may be relied on; store them again")
