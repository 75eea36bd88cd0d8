"""Erasures of one key generation made by another process, enforced on a running cluster.

``agentkv tenant erase T --generation G`` destroys one generation's key in the key directory
and leaves its ``T.gNNNNNNNN.gone`` marker. Pool actors cache keys, so until they forget
that generation's they could still open the copies sealed under it: the erasure had no
effect on a running service. ``GenerationErasures.enforce_new`` (on the erasure watcher's
thread, within ``erasure.WATCH_POLL_S``) has every pool forget the generation's cached keys
and overwrite and drop the copies sealed under it, pages left with no copy leave the
directory, and it records ``erasure.enforced`` (scope ``generation``) in the audit log with
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

    def enforce_present(self) -> list[tuple[str, int]]:
        """At start: every generation erased so far is purged again (a pool that outlived
        the last service may still cache its key); recorded only where a pool held
        something of it. Returns those."""
        found = []
        for tenant, generation in sorted(self._present()):
            if self._enforce(tenant, generation, quiet=True):
                found.append((tenant, generation))
        return found

    def enforce_new(self) -> list[tuple[str, int]]:
        """Purge every generation whose marker appeared since the last look, each recorded
        in the audit log; returns them."""
        present = self._present()
        self.enforced &= present  # a tenant erased whole loses its markers: its name and
        new = sorted(present - self.enforced)  # generation numbers may come back
        for tenant, generation in new:
            self._enforce(tenant, generation, quiet=False)
        return new

    def _enforce(self, tenant: str, generation: int, *, quiet: bool) -> bool:
        """Purge (tenant, generation) on every pool; True when a pool held a copy of it.
        A pool that does not answer fails the purge, which is tried again on the next look."""
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
            held = host + nvme > 0
            if not gone:
                self.enforced.add((tenant, generation))
            else:
                log.warning("erasure of a key generation: pool(s) %s did not answer; tried "
                            "again on the next look", ", ".join(gone))
            if held or gone or not quiet:
                self.audit.append("erasure.enforced", {
                    "tenant": tenant, "scope": "generation", "generation": generation,
                    "counts": [["host", host], ["nvme", nvme]], "failed_tiers": sorted(gone)},
                    time.time())
        return held
