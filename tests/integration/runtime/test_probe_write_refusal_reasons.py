"""The head's probe tells each refusal of every write apart on a real redis-server: a
read-only replica and a server whose persistence fails answer reads, so the directory is up
and ``/readyz`` ready, and the refusal goes to ``agentkv_directory_refuses_writes`` with its
own reason (not ``agentkv_directory_up`` 0 with a "directory unreachable" line)."""

from __future__ import annotations

import pytest

from agentkv_cluster.runtime.directory_glue import RedisSpec
from agentkv_cluster.runtime.directory_watch import probe, probe_redis
from store.directory import WriteRefusal
from tests.support.redis_refusals import failing_persistence, read_only_replica

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("server, reason", [
    (read_only_replica, WriteRefusal.READ_ONLY_REPLICA),
    (failing_persistence, WriteRefusal.PERSISTENCE_FAILING),
], ids=["readonly", "misconf"])
def test_the_probe_reports_the_refusal_with_its_reason(server, reason) -> None:
    with server() as (url, lift):
        spec = RedisSpec(url=url)
        seen = probe_redis(spec)
        assert seen.up and seen.refusal is reason
        ready, line = probe(spec)
        assert ready and "refuses writes" in line
        lift()
        seen = probe_redis(spec)
        assert seen.up and seen.refusal is None
