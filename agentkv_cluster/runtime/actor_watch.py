"""Noticing dead actors without taking busy ones for dead.

The controller actor pings each HBM actor and pool every half second. A ping runs in its
own concurrency group (``actor_groups.HEALTH``), so an actor whose every thread is busy
still answers it. An actor Ray reports dead (``ActorGone``) is forgotten at once; one that
does not answer within the ping's timeout (``ActorSlow``: maybe alive, its process starved)
only after ``STRIKES`` sweeps in a row miss. Before, one missed ping forgot a live HBM actor
for good under a burst of 600 sessions, and every later call on its sessions answered
``KeyError``. ``Strikes`` is pure bookkeeping; ``liveness`` makes the one call;
``ActorWatch`` is the thread that sweeps.
"""

from __future__ import annotations

import enum
import threading
from collections import Counter
from collections.abc import Callable, Hashable, Mapping

from agentkv_cluster.runtime.handles import ActorGone, ActorHandle, ActorSlow

SWEEP_S = 0.5  # between two sweeps
PING_TIMEOUT_S = 5.0  # one sweep's wait for a ping's answer
STRIKES = 3  # sweeps in a row without an answer before a silent actor counts as dead
DEATH_PING_S = 1.0  # ``forget_dead``'s wait for each answer (a silent actor is left alone)


class Liveness(enum.Enum):
    ALIVE = "alive"  # answered
    SLOW = "slow"  # no answer in time (alive and busy, or hung, or dying)
    GONE = "gone"  # Ray says the actor is dead or unreachable


def liveness(handle: ActorHandle, timeout_s: float = PING_TIMEOUT_S) -> Liveness:
    try:
        handle.options(timeout_s=timeout_s).ping()
    except ActorSlow:
        return Liveness.SLOW
    except ActorGone:
        return Liveness.GONE
    return Liveness.ALIVE


def answers(handle: ActorHandle, part: str, timeout_s: float) -> tuple[bool, str]:
    """Readiness of one actor: whether it answered its ping within ``timeout_s``, and a
    line saying so, starting with ``part``."""
    seen = liveness(handle, timeout_s)
    return seen is Liveness.ALIVE, {
        Liveness.ALIVE: f"{part} ok", Liveness.GONE: f"{part} unreachable",
        Liveness.SLOW: f"{part}: no answer within {timeout_s:g} s"}[seen]


class Strikes:
    """Per actor, the sweeps in a row it missed; ``gone`` says when to forget it."""

    def __init__(self, strikes: int = STRIKES) -> None:
        if strikes < 1:
            raise ValueError(f"strikes must be >= 1, not {strikes}")
        self.strikes = strikes
        self._missed: Counter[Hashable] = Counter()

    def gone(self, actor: Hashable, seen: Liveness) -> bool:
        """Whether ``actor``, seen ``seen`` by this sweep, is to be taken for dead."""
        if seen is Liveness.ALIVE:
            self._missed.pop(actor, None)
            return False
        self._missed[actor] += 1
        if seen is Liveness.GONE or self._missed[actor] >= self.strikes:
            del self._missed[actor]
            return True
        return False


class ActorWatch:
    """Sweeps ``hbms`` and ``pools`` (the controller actor's own maps, read live) every
    ``SWEEP_S`` until ``stop``: a dead HBM actor goes to ``hbm_gone`` (its pages fall back
    to their pool copies), a dead pool to ``pool_gone`` (its copies are forgotten; pages
    with no other copy become lost, never wrong). A pool in ``restarting`` is left alone."""

    def __init__(self, hbms: Mapping[str, ActorHandle], pools: Mapping[str, ActorHandle],
                 restarting: set[str], *, hbm_gone: Callable[[str], object],
                 pool_gone: Callable[[str], object], stop: threading.Event) -> None:
        self.hbms, self.pools, self.restarting = hbms, pools, restarting
        self.hbm_gone, self.pool_gone, self.stop = hbm_gone, pool_gone, stop
        self.strikes = Strikes()

    def start(self) -> ActorWatch:
        threading.Thread(target=self._run, name="agentkv-health", daemon=True).start()
        return self

    def _run(self) -> None:
        while not self.stop.wait(SWEEP_S):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001, S112 - the watcher must outlive any one failure
                continue

    def forget_dead(self) -> None:
        """Forget now every actor Ray says died (``Liveness.GONE``), not at the next sweeps:
        a move failed because an actor died, and a load retries it at once. A silent actor
        is left to the sweeps' strikes."""
        for name, handle in list(self.hbms.items()):
            if liveness(handle, DEATH_PING_S) is Liveness.GONE:
                self.hbm_gone(name)
        for name, handle in list(self.pools.items()):
            if name not in self.restarting and liveness(handle, DEATH_PING_S) is Liveness.GONE \
                    and self.pools.get(name) is handle and name not in self.restarting:
                self.pool_gone(name)

    def sweep(self) -> None:
        for name, handle in list(self.hbms.items()):
            if self.strikes.gone(("hbm", name), liveness(handle)):
                self.hbm_gone(name)
        for name, handle in list(self.pools.items()):
            if name in self.restarting:
                continue
            if self.strikes.gone(("pool", name), liveness(handle)) \
                    and self.pools.get(name) is handle and name not in self.restarting:
                self.pool_gone(name)
