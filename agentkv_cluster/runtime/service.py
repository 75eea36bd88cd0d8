"""One running AgentKV service: Ray actors, the API front, the wire server and metrics.

``agentkv serve``, ``agentkv demo``, the benchmarks and the integration tests all
start the service through this class, so they exercise the same code.
"""

from __future__ import annotations

import logging
import secrets
import tempfile
import threading
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentkv_cluster.api.client import AgentKvClient
from agentkv_cluster.api.metrics import MetricsHttpServer, ServiceMetrics
from agentkv_cluster.api.server import ApiServer
from agentkv_cluster.config import AgentKvConfig
from agentkv_cluster.runtime import wiring
from agentkv_cluster.runtime.actor_watch import Liveness, answers, liveness
from agentkv_cluster.runtime.directory_watch import DirectoryWatch, ready
from agentkv_cluster.runtime.erasure import ClusterErasure, ErasureWatcher
from agentkv_cluster.runtime.event_planner import AuditSummary
from agentkv_cluster.runtime.front import ServiceFront
from agentkv_cluster.runtime.metrics_feed import MetricsFeed
from agentkv_cluster.runtime.ray_start import start_ray
from agentkv_cluster.runtime.readiness import Checks, Readiness
from agentkv_cluster.runtime.redis_users import TenantRedisUsers
from agentkv_cluster.runtime.strategies import Learned
from security.audit import AuditLog, denial_recorder
from security.erasure import ErasureReceipt
from security.errors import SecurityError
from security.principals import TokenIssuer
from security.signing import Signer, load_signer, write_keypair

log = logging.getLogger(__name__)
AUDIT_POLL_S = 1.0  # retired-page summaries reach the audit log within this
MAX_UNWRITTEN = 100_000  # summaries kept while the audit log refuses them (a full disk)
JOIN_POLL_S = 2.0  # how often the service looks for Ray nodes that joined


class Service:
    def __init__(self, cfg: AgentKvConfig, *, workdir: Path | None = None,
                 policy: str | None = None, credits: bool = True,
                 hbm_capacity: int | None = None, token_secret: bytes | None = None) -> None:
        arena = cfg.hbm.page_bytes * cfg.hbm.num_pages
        if hbm_capacity is not None and not 0 < hbm_capacity <= arena:
            # a budget past the arena: the controller would place pages the HBM actor has
            # no page for, and stores would fail with ArenaFull as internal errors
            raise ValueError(f"hbm_capacity {hbm_capacity} B must be in (0, {arena}] (the "
                             f"arena: hbm.num_pages {cfg.hbm.num_pages} x hbm.page_bytes)")
        self.cfg = cfg
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="agentkv-"))
        self.policy = policy or cfg.controller.policy
        self.credits = credits
        self._learned: dict[str, Learned] = {}  # policy -> what its last controller learned
        self.hbm_capacity = hbm_capacity
        self.token_secret = token_secret or secrets.token_bytes(32)
        self.issuer = TokenIssuer(self.token_secret)
        self.metrics = ServiceMetrics(cfg.metrics.top_tenants, label_key=self.token_secret,
                                      tenant_names=cfg.metrics.tenant_names)
        self.topo: wiring.Topology | None = None
        self.front: ServiceFront | None = None
        self.server: ApiServer | None = None
        self.http: MetricsHttpServer | None = None
        self._stop = threading.Event()
        self.ready = Readiness(self._readiness_checks, self._stop)  # what /readyz answers
        self.directory_watch: DirectoryWatch | None = None  # serve's, on a Redis directory
        self._joiner: threading.Thread | None = None
        self._topology = threading.Lock()  # joins and policy swaps change the topology
        self.audit: AuditLog | None = None  # erasures and every cross-tenant denial
        self.erasure: ClusterErasure | None = None
        self.redis_users: TenantRedisUsers | None = None
        self._watcher: ErasureWatcher | None = None
        self._auditor: threading.Thread | None = None
        # Retired-page summaries drained from the controller that the log refused so far.
        self._unwritten: deque[AuditSummary] = deque(maxlen=MAX_UNWRITTEN)

    @property
    def keys_dir(self) -> str:
        return self.cfg.security.tenant_keys_dir or str(self.workdir / "keys")

    def start(self, *, metrics_http: bool = False, local: bool = False) -> Service:
        """Deploy on Ray (joining ``cfg.ray.address`` or starting a local one), or with
        ``local=True`` build every actor in this process (no Ray; tests and tools)."""
        if local:
            self.topo = wiring.deploy_local(self.cfg, self.workdir, policy=self.policy,
                                            hbm_capacity=self.hbm_capacity)
        else:
            start_ray(self.cfg)
            self.topo = wiring.deploy(self.cfg, self.workdir, policy=self.policy,
                                      credits=self.credits, hbm_capacity=self.hbm_capacity)
        signer = self.audit_signer()
        self.audit = AuditLog(self.cfg.security.audit_log or self.workdir / "audit.log", signer,
                              checkpoint_every=1)
        self.front = ServiceFront(self.topo.controller, self.topo.hbms, self.keys_dir,
                                  self.issuer, self.metrics, self.cfg.hbm.page_bytes,
                                  on_denied=denial_recorder(self.audit, time.time),
                                  max_reply_bytes=self.cfg.api.max_frame_bytes)
        wiring.connect(self.topo, self.front)
        if self.cfg.directory.redis_url:  # each tenant gets its own confined Redis user
            self.redis_users = TenantRedisUsers(self.cfg.directory.redis_url, self.keys_dir,
                                                self.workdir / "redis-users",
                                                prefix=self.cfg.directory.prefix)
            self.redis_users.reconcile()
        self.erasure = ClusterErasure(self.topo, self.front, self.keys_dir, self.audit, signer,
                                      self.redis_users)
        self._watcher = ErasureWatcher(self.erasure, self._stop).start()
        self.front.erasures.on_pending = self._watcher.wake  # a request met a new mark
        self._auditor = threading.Thread(target=self._audit_loop, name="agentkv-audit",
                                         daemon=True)
        self._auditor.start()
        self.server = ApiServer(self.cfg.api, self.front, self.front.authenticate,
                                self.metrics).start()
        if metrics_http:
            self.http = MetricsHttpServer(self.metrics, self.ready, self.cfg.metrics.host,
                                          self.cfg.metrics.port, MetricsFeed(self),
                                          alive=self.alive).start()
        if not local:
            self._joiner = threading.Thread(target=self._join_nodes, name="agentkv-join",
                                            daemon=True)
            self._joiner.start()
        return self

    def _join_nodes(self) -> None:
        """Nodes that join the Ray cluster later (GPU workers scaled up) get their HBM
        actors (and a pool on pool nodes) within ``JOIN_POLL_S``."""
        while not self._stop.wait(JOIN_POLL_S):
            try:
                assert self.topo is not None
                wiring.meet_unmet(self.topo)  # not under the lock: each try may take minutes
                with self._topology:
                    assert self.topo is not None
                    added = wiring.join_new_nodes(self.cfg, self.topo, self.front,
                                                  self.hbm_capacity)
                if added:
                    log.info("placed actors on joined nodes: %s", ", ".join(added))
            except Exception:  # logged; the service keeps serving on the nodes it has
                log.exception("placing actors on joined nodes failed")

    def alive(self) -> tuple[bool, str]:
        """What ``/healthz`` answers: the process answers and its controller is not dead.
        Nothing replaces a dead controller (its page table is the service's state): every
        request failed ``ActorGone`` while ``/healthz`` said ok, so the pod was never
        restarted. A slow controller is alive (``/readyz`` says it is not ready)."""
        topo = self.topo
        if topo is None or self._stop.is_set():
            return True, "ok"
        if liveness(topo.controller, self.ready.deadline_s) is Liveness.GONE:
            return False, ("controller gone: this service cannot serve again until it is "
                           "restarted")
        return True, "ok"

    def _readiness_checks(self) -> Checks:
        """What ``/readyz`` asks (``runtime.readiness``): the controller answers and the
        directory (Redis) is reachable, each within the readiness deadline."""
        assert self.topo is not None
        controller, directory = self.topo.controller, self.topo.directory
        deadline_s = self.ready.deadline_s
        return {"controller": lambda: answers(controller, "controller", deadline_s),
                "directory": lambda: ready(directory, self.directory_watch, deadline_s)}

    def use_policy(self, policy: str, *, credits: bool | None = None) -> None:
        """A fresh controller on the same actors (emptied): for side-by-side policy runs.
        Pages and transfers start again; what a policy learned online (its predictor)
        is kept for its next controller, as a running service keeps it."""
        assert self.topo is not None and self.front is not None
        with self._topology:
            self.drain_audit()  # the old controller's retired-page summaries are kept
            topo = self.topo
            topo.controller.close()  # its executor's moves end before the actors are emptied
            learned = topo.controller.learned()
            if learned is not None:
                self._learned[learned.policy] = learned
            topo.controller.kill()
            for h in [*topo.hbms.values(), *topo.pools.values()]:
                h.reset()
            self.policy = policy
            self.credits = self.credits if credits is None else credits
            spec = replace(wiring.controller_spec(self.cfg, policy, self.credits),
                           learned=self._learned.get(policy))
            topo.controller = wiring.spawn_controller(spec, topo.directory)
            wiring.announce(topo, list(topo.pools), list(topo.hbms),
                            wiring.capacity_of(self.cfg, self.hbm_capacity))
            self.front.controller = topo.controller

    @property
    def address(self) -> tuple[str, int] | str:
        assert self.server is not None and self.server.address is not None
        return self.server.address

    def token(self, tenant: str, **kwargs: Any) -> str:
        kwargs.setdefault("subject", "agent")
        return self.issuer.issue(tenant, now=time.time(), ttl_s=kwargs.pop("ttl_s", 86400.0),
                                 **kwargs)

    def client(self, tenant: str, **kwargs: Any) -> AgentKvClient:
        return AgentKvClient.connect(self.address, self.token(tenant, **kwargs))

    def erase_tenant(self, tenant: str) -> ErasureReceipt:
        """Crypto-shred ``tenant`` and purge it from the running cluster as one transaction
        (``runtime.erasure``): keys destroyed, then the front, controller, HBM actors, pools
        and directory each drop and scrub what they hold of it; the receipt, signed last,
        lists what each tier did and verifies with the audit public key alone."""
        assert self.erasure is not None
        receipt = self.erasure.erase(tenant)
        # agentkv_erasures_total{result}; the tenant's metric series go with it.
        self.metrics.erased(tenant, failed=bool(receipt.failed_tiers))
        return receipt

    def audit_signer(self) -> Signer:
        """The audit signing key (``security.audit_key``), or one generated in the workdir
        with its public half next to it (``audit.pub``) for receipt checks."""
        if self.cfg.security.audit_key:
            return load_signer(self.cfg.security.audit_key)
        private = self.workdir / "audit.key"
        if private.exists():
            return load_signer(private)
        return write_keypair(private, self.workdir / "audit.pub")

    def stats(self) -> dict[str, Any]:
        assert self.topo is not None
        return self.topo.controller.stats()

    def drain_audit(self) -> int:
        """Append the summaries of audited pages retired since the last call to the audit
        log (paper §5.2: identity, type and content hash stay; the KV bytes go). Returns
        how many were written."""
        if self.topo is None or self.audit is None:
            return 0
        try:
            summaries = self.topo.controller.options(timeout_s=10.0).drain_audit()
        except Exception:  # noqa: BLE001 - the controller is gone: nothing left to drain
            log.warning("could not drain retired-page summaries from the controller")
            return 0
        if len(self._unwritten) + len(summaries) > MAX_UNWRITTEN:
            log.error("the audit log refused retired-page summaries for too long: the %d "
                      "oldest of them are dropped", len(self._unwritten) + len(summaries)
                      - MAX_UNWRITTEN)
        self._unwritten.extend(summaries)
        now, written = time.time(), 0
        while self._unwritten:
            try:
                self.audit.append("page_retired", self._unwritten[0].record(), now)
            except (SecurityError, OSError) as exc:  # a full disk: kept for the next pass
                log.warning("the audit log refused a retired-page summary (%s: %s); %d kept "
                            "to write later", type(exc).__name__, exc, len(self._unwritten))
                break
            self._unwritten.popleft()
            written += 1
        return written

    def _audit_loop(self) -> None:
        while not self._stop.wait(AUDIT_POLL_S):
            try:
                with self._topology:  # not while a policy swap replaces the controller
                    self.drain_audit()
            except Exception:
                log.exception("writing retired-page summaries failed")

    def begin_stop(self) -> None:
        """Stopping begins: ``/readyz`` answers 503 ``not ready: stopping`` from now on, so
        Kubernetes stops routing here while the wire server still serves, and the
        background threads end. ``stop`` begins with this; a caller with work of its own
        to do before ``stop`` (a signal handler) can call it first."""
        self._stop.set()

    def stop(self, *, shutdown_ray: bool = False) -> None:
        self.begin_stop()
        if self._joiner is not None:
            self._joiner.join(30.0)
        if self._watcher is not None:
            self._watcher.join(30.0)
        if self.http is not None:
            self.http.stop()
        if self.topo is not None:  # loads blocked for room end now, not at their deadline:
            try:  # the server's stop waits for its running requests
                self.topo.controller.options(timeout_s=10.0).close()
            except Exception:  # noqa: BLE001 - the controller is gone: nothing waits in it
                log.warning("could not close the controller before the wire server")
        if self.server is not None:
            self.server.stop()
        if self._auditor is not None:
            self._auditor.join(30.0)
        self.drain_audit()  # what retired since the last pass
        if self.topo is not None:
            wiring.shutdown(self.topo)
        if self.front is not None:
            self.front.mover.close()
        if self.audit is not None:
            self.audit.close()
            self.audit = None
        if self.redis_users is not None:
            self.redis_users.close()
        if shutdown_ray:
            import ray

            ray.shutdown()
