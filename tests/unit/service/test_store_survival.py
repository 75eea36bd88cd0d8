"""``store_held``: a store's reply names its pages only once they outlived the HBM actor
that took them (pure: local handles stand in for the HBM actors, no Ray, no bytes).

The real death of an HBM actor under a running store is in
``tests/integration/runtime/test_store_outlives_hbm_death.py``."""

from __future__ import annotations

import pytest

from agentkv_cluster.api.errors import PageLost
from agentkv_cluster.runtime.actor_watch import Liveness
from agentkv_cluster.runtime.handles import ActorGone, ActorSlow, HbmHandle
from agentkv_cluster.runtime.store_survival import STORE_ATTEMPTS, Survival, judge, store_held


@pytest.mark.parametrize(("took", "seen", "verdict"), [
    ({"h0"}, Liveness.ALIVE, Survival.HELD),
    ({"h0"}, Liveness.SLOW, Survival.HELD),  # busy: the watcher's to judge
    ({"h0"}, Liveness.GONE, Survival.DIED),
    (set(), Liveness.ALIVE, Survival.HELD),  # nothing to ingest: every page was held already
    ({"h0", "h1"}, Liveness.ALIVE, Survival.MOVED),
    ({"h0", "h1"}, Liveness.GONE, Survival.MOVED),
])
def test_judge(took: set[str], seen: Liveness, verdict: Survival) -> None:
    assert judge(took, seen) is verdict


class _Hbm:
    """An HBM actor's ping: it answers until it died."""

    def __init__(self) -> None:
        self.dead = False

    def ping(self) -> str:
        if self.dead:
            raise ActorGone("hbm: ActorDiedError")
        return "hbm"


class _Cluster:
    """The controller's side of a store, as ``store_held`` sees it: where the session is
    placed, which actors it forgot, and a store that may kill or move things as it runs
    (it returns the actors its chunks landed in, as the controller's ``store`` does)."""

    def __init__(self, *names: str) -> None:
        self.actors = {n: _Hbm() for n in names}
        self.hbms = {n: HbmHandle.local(a, n) for n, a in self.actors.items()}
        self.placed = names[0]
        self.forgotten: list[str] = []
        self.runs = 0
        self.controller_gone = False
        self.during: list = []  # what each run does to the cluster, in order

    def forget(self, name: str) -> None:
        self.forgotten.append(name)
        self.placed = next(n for n in self.hbms if n not in self.forgotten)

    def store(self) -> set[str]:
        self.runs += 1
        took = {self.placed}  # the first chunk
        if self.during:
            self.during.pop(0)(self)
        return took | {self.placed}  # the last chunk

    def controller(self) -> str:
        if self.controller_gone:
            raise ActorGone("controller: RayActorError")
        return "controller"

    def run(self) -> int:
        return store_held(self.store, self.hbms, self.forget, self.controller)


def _dies(c: _Cluster) -> None:
    """The session's actor dies after its chunks landed; nobody noticed yet."""
    c.actors[c.placed].dead = True


def _moves(c: _Cluster) -> None:
    """The session's actor dies between two chunks; the watcher moved the session."""
    c.actors[c.placed].dead = True
    c.forget(c.placed)


def _fails(c: _Cluster) -> None:
    """A chunk's ingest found its actor dead: the controller forgot it and raised."""
    _moves(c)
    raise ActorGone("h: RayActorError")


def test_a_store_whose_actor_lives_runs_once() -> None:
    c = _Cluster("h0", "h1")
    assert c.run() == 1 and c.forgotten == []


def test_a_store_whose_actor_died_after_the_last_chunk_is_forgotten_and_run_again() -> None:
    c = _Cluster("h0", "h1")
    c.during = [_dies]
    assert c.run() == 2 and c.forgotten == ["h0"] and c.placed == "h1"


def test_a_store_whose_session_moved_meanwhile_runs_again() -> None:
    c = _Cluster("h0", "h1")
    c.during = [_moves]
    assert c.run() == 2 and c.forgotten == ["h0"]


def test_a_store_that_failed_as_its_actor_died_runs_again() -> None:
    c = _Cluster("h0", "h1")
    c.during = [_fails]
    assert c.run() == 2


def test_a_slow_actor_is_raised_not_run_again() -> None:
    c = _Cluster("h0", "h1")

    def slow(_c: _Cluster) -> None:
        raise ActorSlow("h0: no answer in 120 s")

    c.during = [slow]
    with pytest.raises(ActorSlow):
        c.run()
    assert c.runs == 1


def test_pages_that_never_outlive_their_actors_are_page_lost() -> None:
    c = _Cluster(*(f"h{i}" for i in range(STORE_ATTEMPTS + 1)))
    c.during = [_dies] * STORE_ATTEMPTS
    with pytest.raises(PageLost, match="store them again"):
        c.run()
    assert c.runs == STORE_ATTEMPTS and len(c.forgotten) == STORE_ATTEMPTS


def test_a_dead_controller_is_raised_as_itself_not_as_page_lost() -> None:
    c = _Cluster("h0", "h1", "h2", "h3")
    c.during = [_fails] * STORE_ATTEMPTS
    c.controller_gone = True
    with pytest.raises(ActorGone, match="controller"):
        c.run()


def test_a_store_that_ingested_nothing_pings_no_actor() -> None:
    c = _Cluster("h0")
    c.actors["h0"].dead = True  # would be judged DIED if it were pinged
    assert store_held(lambda: set(), c.hbms, c.forget, c.controller) == 1
    assert c.forgotten == []
