"""Erasures of one key generation made by another process, enforced on a running cluster.

``agentkv tenant erase T --generation G`` destroys one generation's key in the key directory
and leaves its ``T.gNNNNNNNN.gone`` marker. Pool actors cache keys, so until they forget
that generation's they could still open the copies sealed under it: the erasure had no
effect on a running service. ``GenerationErasures.enforce_new`` (on the erasure watcher's
thread, within ``erasure.WATCH_POLL_S``) has every pool forget the generation's cached keys
and overwrite and drop the copies sealed under it, pages left with no copy leave the
directory, the controller's page records lose them (a prefix lookup stops before such a
page), and it records ``erasure.enforced`` (scope ``generation``) in the audit log with
its counts. A page whose copy went is restored no more (the engine recomputes it).

Pages resident in HBM are plaintext, sealed under no generation: they stay. A generation
erasure retires a key and what was sealed with it; erasing the tenant removes its pages.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from agentkv_cluster.runtime.handles import ActorGone
from security.audit import AuditLog
from security.keyring import FileKeySource, TenantKeyring

if TYPE_CHECKING:
    from agentkv_cluster.runtime.wiring import Topology

log = logging.getLogger(__name__)


class GenerationErasures:
    """Enforces generation erasures made outside the service (thread-safe: ``lock`` is the
    cluster erasure's, one erasure at a time)."""

    def __init__(self, topo: Topology, keys_dir: str, audit: AuditLog,
                 lock: threading.Lock) -> None:
        self.topo, self.keys_dir, self.audit = topo, keys_dir, audit
        self._lock = lock
        self.enforced: set[tuple[str, int]] = set()  # (tenant, generation) purged here

    def _present(self) -> set[tuple[str, int]]:
        ring = TenantKeyring(FileKeySource(self.keys_dir, writable=False))
        return set(ring.erased_generations())

    def remember_present(self) -> None:
        """At start: generations erased so far need nothing here. The pools started with
        this service (they are not detached actors) and cache no key yet, and a restarted
        pool drops the records it can no longer open as it rebuilds its index."""
        self.enforced = self._present()

    def enforce_new(self) -> list[tuple[str, int]]:
        """Purge every generation whose marker appeared since the last look, each recorded
        in the audit log; returns them."""
        present = self._present()
        self.enforced &= present  # a tenant erased whole loses its markers: its name and
        new = sorted(present - self.enforced)  # generation numbers may come back
        for tenant, generation in new:
            self._enforce(tenant, generation)
        return new

    def _enforce(self, tenant: str, generation: int) -> None:
        """Purge (tenant, generation) on every pool. A pool that does not answer fails the
        purge, which is tried again on the next look."""
        host = nvme = 0
        gone: list[str] = []
        with self._lock:
            for name, pool in list(self.topo.pools.items()):
                try:
                    got = pool.options(timeout_s=300.0).purge_tenant(tenant, generation)
                except ActorGone:
                    gone.append(name)
                    continue
                host, nvme = host + got.host, nvme + got.nvme
                self._tell_controller(name, tenant, got.copies)
            if not gone:
                self.enforced.add((tenant, generation))
            else:
                log.warning("erasure of a key generation: pool(s) %s did not answer; tried "
                            "again on the next look", ", ".join(gone))
            self.audit.append("erasure.enforced", {
                "tenant": tenant, "scope": "generation", "generation": generation,
                "counts": [["host", host], ["nvme", nvme]], "failed_tiers": sorted(gone)},
                time.time())

    def _tell_controller(self, pool: str, tenant: str, copies: tuple[tuple[bytes, int], ...]
                         ) -> None:
        """The controller's page records lose the copies ``pool`` overwrote: a prefix
        lookup no longer counts a page left with no copy (its load would be ``page_lost``)."""
        if not copies:
            return
        try:
            self.topo.controller.options(timeout_s=60.0).copies_erased(pool, tenant, list(copies))
        except ActorGone:  # nothing is readable: its loads are page_lost all the same
            log.warning("erasure of a key generation: the controller did not answer; lookups "
                        "may count pages whose copies went (their loads are page_lost)")
