"""Real redis-servers that answer reads but refuse every write, for a reason other than
memory: a read-only replica (``READONLY``, what a primary demoted in a failover becomes)
and a server whose RDB snapshot failed under ``stop-writes-on-bgsave-error yes``
(``MISCONF``). Each is made the way it happens in production, not faked."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import redis as redis_py

from tests.support.redis_proc import RedisProcess


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@contextmanager
def read_only_replica(seed: Callable[[str], object] = lambda _url: None
                      ) -> Iterator[tuple[str, Callable[[], None]]]:
    """(url, lift): a replica (``replica-read-only yes``) of a primary that ``seed(url)``
    filled first, synced; ``lift()`` promotes it (``REPLICAOF NO ONE``)."""
    primary, second = RedisProcess().start(), RedisProcess().start()
    source = redis_py.Redis.from_url(primary.url)
    admin = redis_py.Redis.from_url(second.url)
    try:
        seed(primary.url)
        admin.config_set("replica-read-only", "yes")
        admin.replicaof("127.0.0.1", primary.port)
        wait_until(lambda: admin.info("replication").get("master_link_status") == "up"
                   and admin.dbsize() == source.dbsize(), "the replica's sync")
        yield second.url, lambda: admin.replicaof("NO", "ONE")
    finally:
        source.close()
        admin.close()
        second.close()
        primary.close()


@contextmanager
def failing_persistence(seed: Callable[[str], object] = lambda _url: None
                        ) -> Iterator[tuple[str, Callable[[], None]]]:
    """(url, lift): a server filled by ``seed(url)``, then made to refuse writes by a real
    failed ``BGSAVE`` (its folder removed under it, which fails for root too);
    ``lift()`` saves to its own folder again, which ends the refusal."""
    server = RedisProcess(extra_config="enable-protected-configs yes\n"
                                       "stop-writes-on-bgsave-error yes").start()
    admin = redis_py.Redis.from_url(server.url)

    def save(folder: str, status: str) -> None:
        wait_until(lambda: not admin.info("persistence")["rdb_bgsave_in_progress"], "a save")
        admin.config_set("dir", folder)
        if status == "err":
            Path(folder).rmdir()
        admin.bgsave()
        wait_until(lambda: not admin.info("persistence")["rdb_bgsave_in_progress"]
                   and admin.info("persistence")["rdb_last_bgsave_status"] == status,
                   f"a save with status {status}")

    try:
        admin.config_set("save", "3600 1")  # MISCONF applies only with save points set
        seed(server.url)
        save(tempfile.mkdtemp(prefix="agentkv-gone-"), "err")  # CONFIG SET dir needs it
        yield server.url, lambda: save(str(server.workdir), "ok")
    finally:
        admin.close()
        server.close()
