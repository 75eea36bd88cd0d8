"""An actor whose start failed: the service said only "ActorGone: node0: ActorDiedError"
after a minute, the cause (a pool /dev/shm cannot hold, a Redis URL with a bad port) in a
Ray worker log. The ActorGone message now carries the error its ``__init__`` raised, as
the last line of the text Ray keeps (real Ray, tried by hand, gives
``ActorDiedError: its start failed: ValueError: ...``)."""

from __future__ import annotations

from ray import exceptions as rex

from agentkv_cluster.runtime.handles import _why_gone

RAY_TEXT = """The actor died because of an error raised in its creation task, \
ray::PoolActor.__init__() (pid=4242, ip=10.0.0.5, actor_id=abc)
  File "/app/agentkv_cluster/runtime/pool_actor.py", line 80, in __init__
    self.pool = HostPool.create(...)
store.types.PoolFull: /dev/shm cannot hold a 1100602150912-byte pool (63 GiB free)
"""


def test_a_failed_start_names_its_error():
    exc = rex.RayActorError(actor_id="abc", error_msg=RAY_TEXT, actor_init_failed=True)
    assert _why_gone(exc) == ("RayActorError: its start failed: store.types.PoolFull: /dev/shm "
                              "cannot hold a 1100602150912-byte pool (63 GiB free)")


def test_a_death_after_start_is_named_by_its_kind():
    exc = rex.RayActorError(actor_id="abc", error_msg="The actor died unexpectedly.")
    assert _why_gone(exc) == "RayActorError"
