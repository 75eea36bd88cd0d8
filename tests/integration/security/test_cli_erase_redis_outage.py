"""``agentkv tenant erase --redis-url`` across a Redis outage, on a real redis-server that is
killed and started again (with its AOF, as a restarted or failed-over Redis keeps its data).

The directory step runs before any key is destroyed and retries an unreachable Redis as the
service's erasure does, telling each wait on stderr; an outage shorter than ``--retry-s``
is waited out, a longer one (or a Redis that refuses writes) destroys no key and says so,
and the same command run again completes the erasure."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import redis as redis_py

from agentkv_cluster.cli import main
from security.blinding import DirectoryBlinder
from security.keyring import FileKeySource, TenantKeyring
from store.directory.redis_backend import TOMBSTONES
from tests.support.redis_proc import RedisProcess
from tests.support.redis_refusals import read_only_replica

pytestmark = pytest.mark.integration
ERASED = f"akv:{{{TOMBSTONES}}}:erased"
ENTRIES = 50_000  # enough that deleting them outlasts the kill that interrupts it


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def aof_redis():
    """A private redis-server that keeps what it acknowledged across a SIGKILL."""
    server = RedisProcess(extra_config="appendonly yes\nappendfsync always").start()
    yield server
    server.close()


@pytest.fixture
def tenants(tmp_path, capsys):
    """(erase argv without --redis-url, keys dir, namespaces): acme and globex created."""
    keys, log, sk, pk = (str(tmp_path / n) for n in ("keys", "audit.log", "sk.pem", "pk.pem"))
    assert _run(capsys, "audit", "keygen", "--private", sk, "--public", pk)[0] == 0
    for tenant in ("acme", "globex"):
        assert _run(capsys, "tenant", "create", tenant, "--keys-dir", keys)[0] == 0
    blinder = DirectoryBlinder(TenantKeyring(FileKeySource(keys)))
    names = {t: blinder.namespace(t) for t in ("acme", "globex")}
    argv = ("tenant", "erase", "acme", "--keys-dir", keys, "--audit-log", log,
            "--signing-key", sk)
    return argv, Path(keys), names


def _seed(url: str, names: dict[str, str], acme_entries: int) -> redis_py.Redis:
    admin = redis_py.Redis.from_url(url)
    pipe = admin.pipeline(transaction=False)
    for tenant, count in (("acme", acme_entries), ("globex", 2)):
        for i in range(count):
            pipe.set(f"akv:{{{names[tenant]}}}:e:{i:064x}", b"entry")
            if i % 5000 == 4999:
                pipe.execute()
    pipe.set(f"akv:{{{names['acme']}}}:meta", b"gen")
    pipe.execute()
    return admin


def _keys_of(admin: redis_py.Redis, ns: str) -> int:
    return sum(1 for _ in admin.scan_iter(match=f"akv:{{{ns}}}:*", count=5000))


def _erased(keys: Path) -> bool:
    left = sorted(p.name for p in keys.iterdir() if p.name.startswith("acme."))
    return (len(left) == 2 and left[0].startswith("acme.dirns.")  # only its erasure marks
            and left[1].startswith("acme.erased."))


def test_a_redis_killed_and_restarted_during_the_erase_is_waited_out(
        capsys, aof_redis, tenants) -> None:
    argv, keys, names = tenants
    admin = _seed(aof_redis.url, names, ENTRIES)

    def kill_then_restart() -> None:
        """Kill Redis as soon as the erasure's tombstone lands (its deletion under way),
        start it again a second later."""
        watcher = redis_py.Redis.from_url(aof_redis.url)
        deadline = time.monotonic() + 60
        while not watcher.exists(ERASED) and time.monotonic() < deadline:
            pass
        aof_redis.stop()
        time.sleep(1.0)
        aof_redis.start()

    outage = threading.Thread(target=kill_then_restart, daemon=True)
    outage.start()
    rc, out, err = _run(capsys, *argv, "--redis-url", aof_redis.url, "--retry-s", "60")
    outage.join(timeout=60)
    assert rc == 0, err
    waits = [line for line in err.splitlines() if "retrying in" in line]
    assert waits and all("is unreachable" in w and "nothing erased yet" in w for w in waits)
    receipt = json.loads(out)
    assert receipt["failed_tiers"] == [] and 0 < dict(receipt["counts"])["directory"] <= ENTRIES
    admin = redis_py.Redis.from_url(aof_redis.url)
    assert _keys_of(admin, names["acme"]) == 0 and _keys_of(admin, names["globex"]) == 2
    assert admin.zrange(ERASED, 0, -1) == [names["acme"].encode()]
    assert _erased(keys)
    admin.close()


def test_an_outage_longer_than_retry_s_erases_nothing_and_a_rerun_completes_it(
        capsys, aof_redis, tenants) -> None:
    argv, keys, names = tenants
    _seed(aof_redis.url, names, 3).close()
    aof_redis.stop()
    rc, out, err = _run(capsys, *argv, "--redis-url", aof_redis.url, "--retry-s", "1")
    assert (rc, out) == (2, "")  # no receipt: no key was destroyed
    assert "retrying in" in err  # it did wait
    final = err.splitlines()[-1]
    assert f"Redis at {aof_redis.url} could not be reached within --retry-s 1" in final
    assert "the tenant was not erased: its keys are intact" in final
    assert "run the same command again" in final
    assert TenantKeyring(FileKeySource(keys)).has_keys("acme") and not _erased(keys)

    aof_redis.start()
    rc, out, err = _run(capsys, *argv, "--redis-url", aof_redis.url, "--retry-s", "1")
    assert rc == 0, err
    assert json.loads(out)["counts"] == [["directory", 3]]
    admin = redis_py.Redis.from_url(aof_redis.url)
    assert _keys_of(admin, names["acme"]) == 0 and _keys_of(admin, names["globex"]) == 2
    assert _erased(keys)
    admin.close()


def test_a_replica_refuses_the_erase_which_destroys_no_key(capsys, tenants) -> None:
    """A URL naming a replica (or a primary demoted meanwhile): the erase is refused at once
    with the reason; it used to destroy the keys and report the directory step done."""
    argv, keys, _names = tenants
    with read_only_replica() as (url, lift):
        rc, out, err = _run(capsys, *argv, "--redis-url", url)
        assert (rc, out) == (2, "")
        assert "refuses writes (read_only_replica" in err and "was not erased" in err
        assert "retrying" not in err
        assert TenantKeyring(FileKeySource(keys)).has_keys("acme") and not _erased(keys)
        lift()
        rc, out, err = _run(capsys, *argv, "--redis-url", url)
        assert rc == 0 and json.loads(out)["counts"] == [["directory", 0]]


def test_an_audit_log_that_would_refuse_the_receipt_stops_the_erase_before_redis(
        capsys, aof_redis, tenants, tmp_path) -> None:
    """The directory step and the key destruction both need the receipt's record: a log
    with an over-long last line (corrupt or hostile) is refused when the command opens it,
    and nothing changes (it used to be cut off as a torn write, and the erase went on)."""
    argv, keys, names = tenants
    admin = _seed(aof_redis.url, names, 10)
    log = Path(argv[argv.index("--audit-log") + 1])
    assert _run(capsys, "tenant", "rotate", "globex", "--keys-dir", str(keys), "--audit-log",
                str(log), "--signing-key", argv[-1])[0] == 0  # the log exists and verifies
    with open(log, "ab") as f:
        f.write(b"x" * (2 << 20))  # a line past the 1 MiB bound, no newline
    rc, _out, err = _run(capsys, *argv, "--redis-url", aof_redis.url)
    assert rc == 2 and "longer than the maximum record line" in err
    assert _keys_of(admin, names["acme"]) == 11 and not _erased(keys)
    admin.close()


class _Killed(BaseException):
    """The erasing process dies here."""


def test_finishing_an_erasure_whose_keys_are_gone_says_so_when_redis_is_down(
        capsys, aof_redis, tenants, monkeypatch) -> None:
    """Cut off after its keys went and before its end record, an erasure is finished by the
    same command; with Redis down that rerun said "its keys are intact" and "nothing erased
    yet", while the keys were gone."""
    from security.erasure import Eraser

    argv, keys, names = tenants
    _seed(aof_redis.url, names, 3).close()

    def killed(*_args: object) -> None:
        raise _Killed

    monkeypatch.setattr(Eraser, "_finish", killed)
    with pytest.raises(_Killed):
        _run(capsys, *argv, "--redis-url", aof_redis.url)
    monkeypatch.undo()
    capsys.readouterr()
    assert not TenantKeyring(FileKeySource(keys)).has_keys("acme")
    aof_redis.stop()
    rc, out, err = _run(capsys, *argv, "--redis-url", aof_redis.url, "--retry-s", "1")
    assert (rc, out) == (2, "")
    waits = [line for line in err.splitlines() if "retrying in" in line]
    assert waits and all("its keys are gone already" in w for w in waits)
    assert "its keys were destroyed by the erasure this finishes" in err.splitlines()[-1]
    assert "its keys are intact" not in err
    aof_redis.start()
    rc, out, err = _run(capsys, *argv, "--redis-url", aof_redis.url, "--retry-s", "5")
    assert rc == 0, err
    assert json.loads(out)["tenant"] == "acme"
