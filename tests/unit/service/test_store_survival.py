"""``store_held``: a store's reply names its pages only once they outlived the HBM actor
that took them (pure: local handles stand in for the HBM actors, no Ray, no bytes).

The real death of an HBM actor under a running store is in
``tests/integration/runtime/test_store_outlives_hbm_death.py``."""

from __future__ import annotations

import pytest

from agentkv_cluster.api.errors import PageLost
from agentkv_cluster.runtime.handles import ActorGone, ActorSlow
from agentkv_cluster.runtime.store_survival import STORE_ATTEMPTS, Survival, judge, store_held


@pytest.mark.parametrize(("took", "verdict"), [
    ({"h0"}, Survival.HELD),
    (set(), Survival.HELD),  # nothing to ingest: every page was held already
    ({"h0", "h1"}, Survival.MOVED),
])
def test_judge(took: set[str], verdict: Survival) -> None:
    assert judge(took) is verdict


class _Cluster:
    """The controller's side of a store, as ``store_held`` sees it: where the session is
    placed, and a store that may move it as it runs (it returns the actors its chunks
    landed in, as the controller's ``store`` does)."""

    def __init__(self, *names: str) -> None:
        self.names = list(names)
        self.placed = names[0]
        self.runs = 0
        self.controller_gone = False
        self.during: list = []  # what each run does to the cluster, in order

    def forget(self) -> None:
        """The session's actor died; the watcher moved the session to the next one."""
        self.names.remove(self.placed)
        self.placed = self.names[0]

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
        return store_held(self.store, self.controller)


def _moves(c: _Cluster) -> None:
    """The session's actor dies between two chunks; the watcher moved the session."""
    c.forget()


def _fails(c: _Cluster) -> None:
    """A chunk's ingest found its actor dead: the controller forgot it and raised."""
    c.forget()
    raise ActorGone("h: RayActorError")


def test_a_store_whose_actor_lives_runs_once() -> None:
    assert _Cluster("h0", "h1").run() == 1


def test_a_store_whose_session_moved_meanwhile_runs_again() -> None:
    c = _Cluster("h0", "h1")
    c.during = [_moves]
    assert c.run() == 2 and c.placed == "h1"


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


def test_pages_that_never_land_in_one_actor_are_page_lost() -> None:
    c = _Cluster(*(f"h{i}" for i in range(STORE_ATTEMPTS + 1)))
    c.during = [_moves] * STORE_ATTEMPTS
    with pytest.raises(PageLost, match="store them again"):
        c.run()
    assert c.runs == STORE_ATTEMPTS


def test_a_dead_controller_is_raised_as_itself_not_as_page_lost() -> None:
    c = _Cluster("h0", "h1", "h2", "h3")
    c.during = [_fails] * STORE_ATTEMPTS
    c.controller_gone = True
    with pytest.raises(ActorGone, match="controller"):
        c.run()
