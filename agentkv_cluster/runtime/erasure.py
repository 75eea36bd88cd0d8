"""Tenant erasure on a running cluster, as one transaction.

``ClusterErasure.erase`` crypto-shreds the tenant's keys (``security.erasure.Eraser``:
mark, destroy), then runs the tiers in order, each reporting what it did:

1. ``front``: the API front forgets the tenant's cached keys and blinding secret and
   its prepared loads (a token for the same name then derives new, unrelated keys).
2. ``controller``: refuses the tenant's calls, cancels its moves (its loads in flight
   fail with ``TenantErased`` instead of blocking the erasure), drops its pages, pins,
   sessions and graph; ``hbm`` / ``hbm-scrub``: every HBM actor zeroes the tenant's
   pages, then its free pages and free staging slots.
3. ``host`` / ``nvme``: every pool actor forgets the tenant's keys, overwrites its
   copies (host slots zeroed, NVMe payloads zeroed in place before the tombstone);
   ``host-scrub`` / ``nvme-scrub``: free host slots and dead NVMe records zeroed.
   ``redis-user``: the tenant's Redis ACL user and its credentials file removed.
4. ``directory``: the tenant's blinded namespace deleted (on Redis every key of it,
   ``meta`` and the per-node write counts included), its count the entries removed. An
   unreachable (or stalled) directory is retried for ``DIRECTORY_RETRY_S``: once the keys
   are shredded nothing can name the namespace again.

Only then is the receipt signed; it lists each tier with its count (-1 and the tier
in ``failed_tiers`` when a tier could not finish). A tier holding the tenant's pages or
keys that did not finish leaves the name refused; the watcher runs the purge again until
it does (``RETRY_S``). ``ErasureWatcher`` runs steps 1-3
for an erasure made by another process (``agentkv tenant erase`` on the key directory
while the service runs) and records what it did in the audit log; one generation's
erasure made there is ``generation_erasure``'s.

What the API front lets through meanwhile is ``runtime.front.ErasureGate``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentkv_cluster.runtime.directory_glue import GUARD_BACKOFF, RedisSpec, open_directory
from agentkv_cluster.runtime.generation_erasure import GenerationErasures
from agentkv_cluster.runtime.handles import ActorGone
from security.audit import AuditLog
from security.erasure import Eraser, ErasureReceipt, unfinished_erasures
from security.keyring import FileKeySource, TenantKeyring
from security.signing import Signer
from store.types import Lookup

if TYPE_CHECKING:
    from agentkv_cluster.runtime.front import ServiceFront
    from agentkv_cluster.runtime.wiring import Topology

log = logging.getLogger(__name__)
WATCH_POLL_S = 1.0  # how soon an erasure made by another process is enforced here
RETRY_S = (2.0, 300.0)  # a purge a tier did not finish: first wait, longest wait
SELF_REPAIRED = frozenset({"redis-user"})  # reconciled on every look of the watcher
DIRECTORY_RETRY_S = 60.0  # how long the directory step retries an unreachable directory

# Tier names in receipt order; each maps to a count in the purge report.
TIERS = ("front", "controller", "sessions", "pins", "hbm", "hbm-scrub", "host", "host-scrub",
         "nvme", "nvme-scrub", "redis-user")


@dataclass(frozen=True, kw_only=True)
class PurgeReport:
    """Steps 1-3 of one erasure: each ``TIERS`` name's count (-1 where it failed), why each
    failed tier failed, and the erased keys (for the directory step)."""

    counts: dict[str, int]
    failed: dict[str, str]
    keys: list[bytes]


class ClusterErasure:
    """Runs a tenant's erasure across the front, controller, HBM and pool actors."""

    def __init__(self, topo: Topology, front: ServiceFront | None, keys_dir: str, audit: AuditLog,
                 signer: Signer, users: Any = None) -> None:
        self.topo = topo
        self.users = users  # TenantRedisUsers on a Redis directory, else None
        self.front = front
        self.keys_dir = keys_dir
        self.audit = audit
        self.signer = signer
        self._lock = threading.Lock()  # one erasure at a time
        self.enforced: dict[str, float] = {}  # tenant -> erasure mark already enforced
        self._retry: dict[str, tuple[int, float]] = {}  # tenant -> (tries, next try: monotonic)
        self.generations = GenerationErasures(topo, keys_dir, audit, self._lock)
        # what an erasure whose end the log refused deleted: its rerun's receipt counts it
        self._unrecorded: dict[int, tuple[tuple[str, int], ...]] = {}

    def erase(self, tenant: str) -> ErasureReceipt:
        """Crypto-shred ``tenant`` and purge it from every tier; the signed receipt."""
        with self._lock:
            keyring = TenantKeyring(FileKeySource(self.keys_dir))
            eraser = Eraser(keyring, self.audit, self.signer, self._unrecorded)
            namespaces = eraser.directory_namespaces(tenant)  # nothing to erase: raises
            report = _LazyPurge(lambda: self.purge(tenant))
            for tier in TIERS:
                eraser.register_tier(tier, lambda _s, t=tier: report.count(t))
            eraser.register_tier("directory", lambda _s: sum(
                self._directory(ns, report.keys()) for ns in namespaces))
            if self.front is not None:  # its calls fail from here (``forget`` ends it)
                self.front.erasures.freeze(tenant)
            try:
                try:  # its calls and loads fail from here; the keys go even if this cannot
                    self.topo.controller.freeze_tenant(tenant)
                except ActorGone:
                    log.warning("erasure: the controller is unreachable; its tier will fail")
                receipt = eraser.erase_tenant(tenant, time.time())
            finally:
                if self.front is not None:
                    self.front.erasures.forget(tenant)
                with contextlib.suppress(ActorGone):  # (a finished purge thawed it already)
                    self.topo.controller.thaw_tenant(tenant)
            at = keyring.erased_at(tenant)
            if at is not None:
                self._settle(tenant, at, report.failed(), tries=0)
            return receipt

    def _settle(self, tenant: str, at: float, failed: Iterable[str], tries: int) -> None:
        """After a purge of ``tenant``'s erasure of ``at``: enforced once every tier holding
        its pages or keys finished, else refused and tried again after ``RETRY_S``."""
        unfinished = sorted(set(failed) - SELF_REPAIRED)
        if not unfinished:
            self._retry.pop(tenant, None)
            self._enforced(tenant, at)
            return
        delay = min(RETRY_S[1], RETRY_S[0] * 2 ** tries)
        self._retry[tenant] = (tries + 1, time.monotonic() + delay)
        log.warning("erasure: %s did not finish; tried again in %.0f s",
                    ", ".join(unfinished), delay)

    def _enforced(self, tenant: str, at: float) -> None:
        """What ``tenant`` left at its erasure of ``at`` is purged here: new tokens of the
        name are served from now on."""
        self.enforced[tenant] = at
        if self.front is not None:
            self.front.erasures.enforced(tenant, at)

    def purge(self, tenant: str) -> PurgeReport:
        """Steps 1-3 of the module doc: each tier's count (-1 where it failed, with the
        reason in ``failed``) and the erased keys. Every tier is tried."""
        counts: dict[str, int] = {}
        failed: dict[str, str] = {}
        keys: set[bytes] = set()

        def step(names: tuple[str, ...], fn: Callable[[], dict[str, int]]) -> None:
            try:
                got = fn()
                for name in names:
                    counts[name] = int(got[name])
            except Exception as exc:
                log.exception("erasure of a tenant failed in %s", "/".join(names))
                for name in names:
                    counts[name] = -1
                    failed[name] = f"{type(exc).__name__}: {exc}"[:200]

        step(("front",), lambda: {"front": self.front.forget_tenant(tenant)
                                  if self.front is not None else 0})
        step(("controller", "sessions", "pins", "hbm", "hbm-scrub"),
             lambda: self._controller(tenant))
        step(("host", "host-scrub", "nvme", "nvme-scrub"), lambda: self._pools(tenant, keys))
        step(("redis-user",), lambda: {"redis-user": self.users.remove(tenant)
                                       if self.users is not None else 0})
        return PurgeReport(counts=counts, failed=failed, keys=sorted(keys))

    def _controller(self, tenant: str) -> dict[str, int]:
        got = self.topo.controller.options(timeout_s=120.0).erase_tenant(tenant)
        gone = got.forgotten
        if gone.straggling:
            raise RuntimeError(f"{gone.straggling} transfer(s) did not end in time")
        return {"controller": gone.pages, "sessions": gone.sessions, "pins": gone.pins,
                "hbm": got.hbm_pages, "hbm-scrub": got.hbm_free_zeroed}

    def _pools(self, tenant: str, keys: set[bytes]) -> dict[str, int]:
        out = {"host": 0, "host-scrub": 0, "nvme": 0, "nvme-scrub": 0}
        gone = []
        for name, pool in list(self.topo.pools.items()):
            try:
                got = pool.options(timeout_s=300.0).purge_tenant(tenant)
            except ActorGone:
                gone.append(name)  # the other pools are still purged
                continue
            keys.update(key for key, _ in got.copies)
            out["host"] += got.host
            out["nvme"] += got.nvme
            out["host-scrub"] += got.host_free_zeroed
            out["nvme-scrub"] += got.nvme_dead_zeroed
        if gone:
            raise RuntimeError(f"pool(s) {', '.join(gone)} unreachable")
        return out

    def _directory(self, namespace: str, keys: list[bytes]) -> int:
        """The tenant's directory entries removed (their count). The whole namespace goes
        (Redis: entries, generations, ``meta`` and write counts; the embedded one in its
        actor: entries and generation state), whatever the entries' references."""
        from store.directory.retry import retry_unavailable

        d = open_directory(self.topo.directory)

        def drop() -> int:
            delete_namespace = getattr(d, "delete_namespace", None)
            if delete_namespace is not None:
                return int(delete_namespace(namespace))
            return sum(d.delete(namespace, k) is Lookup.HIT for k in keys)

        try:  # the guard's own delays: each wait outlasts it
            return retry_unavailable(
                drop, budget_s=DIRECTORY_RETRY_S, next_delay=GUARD_BACKOFF.after,
                on_wait=lambda w: log.warning("erasure: the directory is unreachable; "
                                              "retrying in %.1f s", w.delay_s))
        finally:
            if d is not self.topo.directory:  # a Redis client opened for this erase
                d.close()

    def reconcile_users(self) -> None:
        """Redis users for tenants created meanwhile (and none for erased ones); never in
        the middle of an erasure, whose receipt counts the user it removes."""
        if self.users is not None:
            with self._lock:
                self.users.reconcile()

    # -- erasures made by another process -----------------------------------------------------
    def enforce_new_marks(self) -> list[str]:
        """Purge every tenant whose erasure mark appeared since the last look (an erasure
        made with ``agentkv tenant erase`` on the key directory); each purge is recorded
        in the audit log as ``erasure.enforced`` with its per-tier counts. A purge that a
        tier holding the tenant's pages or keys did not finish (a pool past its deadline)
        leaves the tenant unenforced (its name stays refused) and is tried again, at
        growing intervals (``RETRY_S``), each try recorded; the directory and Redis users
        have their own repair (``reapply_directory``, ``reconcile_users``)."""
        marks = TenantKeyring(FileKeySource(self.keys_dir)).erasures()
        done = []
        for tenant, at in sorted(marks.items()):
            if self.enforced.get(tenant, 0.0) >= at:
                continue
            tries, due = self._retry.get(tenant, (0, 0.0))
            if time.monotonic() < due:
                continue
            with self._lock:
                if self.enforced.get(tenant, 0.0) >= at:
                    continue
                report = self.purge(tenant)
                counts = [[t, report.counts[t]] for t in TIERS]
                failed = sorted(report.failed)
                named = [ns for t, ns in self._erased() if t == tenant]  # by its mark
                try:
                    counts.append(["directory", sum(self._directory(ns, report.keys)
                                                    for ns in named)])
                except Exception as exc:  # noqa: BLE001 - recorded as a failed tier
                    log.warning("erasure: the directory step failed (%s)", type(exc).__name__)
                    counts.append(["directory", -1])
                    failed.append("directory")
                try:  # on the record before the name is served again
                    self.audit.append("erasure.enforced", {
                        "tenant": tenant, "erased_at": at, "counts": counts,
                        "failed_tiers": failed}, time.time())
                except Exception as exc:  # noqa: BLE001 - unfinished: tried again later
                    log.warning("erasure: the audit log refused it (%s)", type(exc).__name__)
                    self._settle(tenant, at, ["audit-log"], tries)
                else:
                    self._settle(tenant, at, report.failed, tries)
            done.append(tenant)
        return done

    def _erased(self) -> list[tuple[str, str]]:
        """(tenant, blinded namespace) of every erasure whose mark names the namespace."""
        return TenantKeyring(FileKeySource(self.keys_dir)).erased_directory_namespaces()

    def reapply_directory(self) -> int:
        """Erase again the namespaces of erased tenants that the directory holds again (a
        Redis that restarted from a snapshot taken before their erasure), each recorded in
        the audit log as ``erasure.reapplied`` with the entries removed; how many there
        were. Called at start and after each outage or restart of the directory. Only Redis
        keeps data over a restart: the embedded directory lives and dies with the head."""
        from store.directory.base import DirectoryError, DirectoryUnavailable

        if not isinstance(self.topo.directory, RedisSpec):
            return 0
        erased = self._erased()
        if not erased:
            return 0
        d = open_directory(self.topo.directory)
        try:
            held = set(d.held_namespaces([ns for _t, ns in erased]))
            for tenant, ns in erased:
                if ns in held:
                    with self._lock:
                        removed = self._directory(ns, [])
                        self.audit.append("erasure.reapplied", {
                            "tenant": tenant, "counts": [["directory", removed]]}, time.time())
                    log.warning("the directory held an erased tenant's entries again "
                                "(restored from an older snapshot?): deleted, see the audit log")
        except DirectoryUnavailable:
            raise  # away again: the watch calls this once more after its next recovery
        except DirectoryError as exc:  # refused for good (no permission): say so, go on
            log.error("cannot erase again what the directory may hold of erased tenants "
                      "(%s: %s); check with `agentkv audit erased`", type(exc).__name__, exc)
            return 0
        finally:
            d.close()
        return len(held)

    def remember_marks(self) -> list[str]:
        """At start: marks already present were enforced by the service that ran then,
        except where a pool recovered records of a tenant that is erased and has no keys
        now (it was erased while the service was down), and where the audit log holds an
        erasure of the tenant that began and did not end (cut off with its keys still
        there, maybe while no service ran): those are purged here, with an
        ``erasure.enforced`` record. Returns the tenants purged."""
        keyring = TenantKeyring(FileKeySource(self.keys_dir))
        marks = keyring.erasures()
        held: set[str] = set()
        for pool in list(self.topo.pools.values()):
            try:
                held.update(pool.options(timeout_s=60.0).tenants_held())
            except ActorGone:
                continue
        cut = {b.tenant for b in unfinished_erasures(self.audit.path) if b.generation is None} \
            if marks else set()  # no mark: nothing to look up in the log
        stale = {t: at for t, at in marks.items()
                 if t in cut or (t in held and not keyring.has_keys(t))}
        for tenant, at in marks.items():
            if tenant not in stale:
                self._enforced(tenant, at)
        return self.enforce_new_marks() if stale else []


class _LazyPurge:
    """Runs the purge once, when the first tier asks for its count."""

    def __init__(self, run: Callable[[], PurgeReport]) -> None:
        self._run = run
        self._report: PurgeReport | None = None

    def _get(self) -> PurgeReport:
        if self._report is None:
            self._report = self._run()
        return self._report

    def count(self, tier: str) -> int:
        report = self._get()
        if tier in report.failed:
            raise RuntimeError(report.failed[tier])
        return report.counts[tier]

    def keys(self) -> list[bytes]:
        return self._get().keys

    def failed(self) -> list[str]:
        """The tiers whose purge failed."""
        return list(self._get().failed)


class ErasureWatcher:
    """A thread that enforces erasures made by other processes within ``WATCH_POLL_S``."""

    def __init__(self, erasure: ClusterErasure, stop: threading.Event) -> None:
        self.erasure = erasure
        self._stop = stop
        self._wake = threading.Event()
        erasure.remember_marks()
        erasure.generations.remember_present()
        self._thread = threading.Thread(target=self._run, name="agentkv-erasures", daemon=True)

    def start(self) -> ErasureWatcher:
        self._thread.start()
        return self

    def wake(self) -> None:
        """Look for new marks now (a request met one not yet enforced)."""
        self._wake.set()

    def _run(self) -> None:
        try:  # at start; after an outage or restart the directory's watch calls it again
            self.erasure.reapply_directory()
        except Exception as exc:  # noqa: BLE001 - the watch calls it again on recovery
            log.warning("re-applying erasures to the directory failed (%s); done again once "
                        "the directory answers", type(exc).__name__)
        while not self._stop.is_set():
            self._wake.wait(WATCH_POLL_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.erasure.reconcile_users()
                tenants = self.erasure.enforce_new_marks()
                if tenants or self.erasure.generations.enforce_new():  # no names in the log
                    log.info("enforced an erasure made outside this service (see audit log)")
            except Exception:
                log.exception("enforcing an erasure failed")

    def join(self, timeout_s: float) -> None:
        """After the stop event is set: the thread ends now, not at its next look."""
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
