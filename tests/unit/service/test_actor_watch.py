"""A busy actor is not taken for dead: the watcher forgets an actor Ray reports dead at
once, one that misses its ping only after ``STRIKES`` sweeps in a row. One missed ping
used to forget a live HBM actor under a 600-session burst (every later call: KeyError)."""

from __future__ import annotations

import threading

import pytest

from agentkv_cluster.runtime.actor_watch import (
    STRIKES,
    ActorWatch,
    Liveness,
    Strikes,
    answers,
    liveness,
)
from agentkv_cluster.runtime.handles import ActorGone, ActorHandle, ActorSlow


class _Actor:
    def __init__(self, answer: BaseException | None = None) -> None:
        self.answer = answer

    def ping(self) -> str:
        if self.answer is not None:
            raise self.answer
        return "here"


def test_liveness_tells_slow_from_gone() -> None:
    assert liveness(ActorHandle.local(_Actor(), "a")) is Liveness.ALIVE
    assert liveness(ActorHandle.local(_Actor(ActorSlow("no answer in 5 s")), "a")) \
        is Liveness.SLOW
    assert liveness(ActorHandle.local(_Actor(ActorGone("RayActorError")), "a")) \
        is Liveness.GONE


def test_readiness_lines_tell_slow_from_gone() -> None:
    def said(answer: BaseException | None) -> tuple[bool, str]:
        return answers(ActorHandle.local(_Actor(answer), "c"), "controller", 1.5)

    assert said(None) == (True, "controller ok")
    assert said(ActorSlow("no answer in 1.5 s")) == (False, "controller: no answer within 1.5 s")
    assert said(ActorGone("RayActorError")) == (False, "controller unreachable")


def test_a_slow_actor_is_forgotten_only_after_strikes_in_a_row() -> None:
    strikes = Strikes()
    for _ in range(STRIKES - 1):
        assert not strikes.gone("hbm0", Liveness.SLOW)
    assert not strikes.gone("hbm0", Liveness.ALIVE)  # an answer clears its misses
    for _ in range(STRIKES - 1):
        assert not strikes.gone("hbm0", Liveness.SLOW)
    assert strikes.gone("hbm0", Liveness.SLOW)
    assert strikes.gone("hbm1", Liveness.GONE)  # dead is dead at once
    with pytest.raises(ValueError, match="strikes"):
        Strikes(0)


def test_the_watch_forgets_dead_actors_and_spares_busy_ones() -> None:
    busy = ActorHandle.local(_Actor(ActorSlow("no answer")), "busy")
    dead = ActorHandle.local(_Actor(ActorGone("RayActorError")), "dead")
    well = ActorHandle.local(_Actor(), "well")
    hbms = {"busy": busy, "dead": dead, "well": well}
    pools = {"p0": dead, "p1": busy, "p2": dead}
    gone: list[str] = []
    watch = ActorWatch(hbms, pools, {"p2"}, hbm_gone=gone.append,
                       pool_gone=lambda name: gone.append(f"pool/{name}"),
                       stop=threading.Event())
    watch.sweep()
    assert gone == ["dead", "pool/p0"]  # p2 restarts: left alone
    for _ in range(STRIKES - 1):
        watch.sweep()
    assert gone.count("busy") == 1 and gone.count("pool/p1") == 1
    assert "well" not in gone


def test_forget_dead_forgets_only_what_ray_says_died_and_strikes_no_one() -> None:
    """A move failed as an actor died: the dead go at once (a load retries elsewhere); a
    silent one gets no strike from it (only the sweeps judge those)."""
    busy = ActorHandle.local(_Actor(ActorSlow("no answer")), "busy")
    dead = ActorHandle.local(_Actor(ActorGone("RayActorError")), "dead")
    well = ActorHandle.local(_Actor(), "well")
    gone: list[str] = []
    watch = ActorWatch({"busy": busy, "dead": dead, "well": well},
                       {"p0": dead, "p1": busy, "p2": dead}, {"p2"}, hbm_gone=gone.append,
                       pool_gone=lambda name: gone.append(f"pool/{name}"),
                       stop=threading.Event())
    for _ in range(STRIKES + 1):
        watch.forget_dead()
    assert set(gone) == {"dead", "pool/p0"}  # p2 restarts; busy and p1 are the sweeps'
