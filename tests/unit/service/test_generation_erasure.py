"""Which generation erasures the service enforces, and when (``GenerationErasures``): each
``.gone`` marker once, again after a whole-tenant erasure removed the markers and the name
came back, and again on the next look when a pool did not answer. The pools here only
record the purges they are asked for (the purge itself: test_erase_generation_live.py)."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

from agentkv_cluster.runtime.erasure_receipts import PoolPurged
from agentkv_cluster.runtime.generation_erasure import GenerationErasures
from agentkv_cluster.runtime.handles import ActorGone
from security.audit import AuditLog
from security.keyring import FileKeySource, TenantKeyring
from security.signing import Signer


class _Pool:
    def __init__(self, held: int = 0, answers: bool = True) -> None:
        self.held, self.answers, self.asked = held, answers, []

    def options(self, timeout_s: float) -> _Pool:
        return self

    def purge_tenant(self, tenant: str, generation: int | None = None) -> PoolPurged:
        self.asked.append((tenant, generation))
        if not self.answers:
            raise ActorGone("the pool died")
        return PoolPurged(copies=(), host=self.held, nvme=0, host_free_zeroed=0,
                          nvme_dead_zeroed=0, staging_zeroed=0)


def _records(path) -> list[dict]:
    return [r["data"] for r in map(json.loads, path.read_text().splitlines())
            if r["kind"] == "erasure.enforced"]


def _setup(tmp_path, pool: _Pool) -> tuple[TenantKeyring, GenerationErasures, AuditLog]:
    ring = TenantKeyring(FileKeySource(tmp_path / "keys"))
    audit = AuditLog(tmp_path / "audit.log", Signer.generate())
    topo = SimpleNamespace(pools={"p0": pool})
    return ring, GenerationErasures(topo, str(tmp_path / "keys"), audit, threading.Lock()), audit


def test_each_erased_generation_is_enforced_once_and_again_when_the_name_returns(tmp_path):
    pool = _Pool()
    ring, gens, audit = _setup(tmp_path, pool)
    ring.create_tenant("acme")
    ring.rotate("acme")
    ring.destroy_generation("acme", 1)
    assert gens.enforce_new() == [("acme", 1)]
    assert pool.asked == [("acme", 1)]
    assert gens.enforce_new() == [] and len(pool.asked) == 1  # once
    ring.destroy_generation("acme", 2)
    assert gens.enforce_new() == [("acme", 2)]
    assert [(r["tenant"], r["generation"], r["scope"]) for r in _records(audit.path)] == \
        [("acme", 1, "generation"), ("acme", 2, "generation")]
    ring.destroy_tenant("acme")  # the markers go with the tenant
    assert gens.enforce_new() == []
    ring.create_tenant("acme")  # the name comes back, its generation 1 erased again
    ring.rotate("acme")
    ring.destroy_generation("acme", 1)
    assert gens.enforce_new() == [("acme", 1)] and pool.asked[-1] == ("acme", 1)
    audit.close()


def test_generations_erased_before_the_start_are_left_to_the_fresh_pools(tmp_path):
    pool = _Pool(held=2)
    ring, gens, audit = _setup(tmp_path, pool)
    ring.create_tenant("acme")
    ring.rotate("acme")
    ring.destroy_generation("acme", 1)
    gens.remember_present()  # at start
    assert gens.enforce_new() == [] and pool.asked == []
    ring.rotate("acme")
    ring.destroy_generation("acme", 2)
    assert gens.enforce_new() == [("acme", 2)]
    (record,) = _records(audit.path)
    assert record["counts"] == [["host", 2], ["nvme", 0]] and record["failed_tiers"] == []
    audit.close()


def test_a_pool_that_does_not_answer_is_asked_again_on_the_next_look(tmp_path):
    pool = _Pool(answers=False)
    ring, gens, audit = _setup(tmp_path, pool)
    ring.create_tenant("acme")
    ring.rotate("acme")
    ring.destroy_generation("acme", 1)
    assert gens.enforce_new() == [("acme", 1)]
    assert _records(audit.path)[-1]["failed_tiers"] == ["p0"]
    pool.answers = True
    assert gens.enforce_new() == [("acme", 1)] and len(pool.asked) == 2
    assert _records(audit.path)[-1]["failed_tiers"] == []
    assert gens.enforce_new() == [] and len(pool.asked) == 2
    audit.close()
