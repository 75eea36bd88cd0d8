"""One running AgentKV service: Ray actors, the API front, the wire server and metrics.

``agentkv serve``, ``agentkv demo``, the benchmarks and the integration tests all
start the service through this class, so they exercise the same code.
"""

from __future__ import annotations

import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from agentkv_cluster.api.client import AgentKvClient
from agentkv_cluster.api.metrics import MetricsHttpServer, ServiceMetrics
from agentkv_cluster.api.server import ApiServer
from agentkv_cluster.config import AgentKvConfig
from agentkv_cluster.runtime import wiring
from agentkv_cluster.runtime.controller_actor import ControllerSpec
from agentkv_cluster.runtime.front import ServiceFront
from security.principals import TokenIssuer


class Service:
    def __init__(self, cfg: AgentKvConfig, *, workdir: Path | None = None,
                 policy: str | None = None, credits: bool = True,
                 hbm_capacity: int | None = None, token_secret: bytes | None = None) -> None:
        self.cfg = cfg
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="agentkv-"))
        self.policy = policy or cfg.controller.policy
        self.credits = credits
        self.hbm_capacity = hbm_capacity
        self.token_secret = token_secret or secrets.token_bytes(32)
        self.issuer = TokenIssuer(self.token_secret)
        self.metrics = ServiceMetrics(cfg.metrics.top_tenants)
        self.topo: wiring.Topology | None = None
        self.front: ServiceFront | None = None
        self.server: ApiServer | None = None
        self.http: MetricsHttpServer | None = None

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
            wiring.start_ray(self.cfg)
            self.topo = wiring.deploy(self.cfg, self.workdir, policy=self.policy,
                                      credits=self.credits, hbm_capacity=self.hbm_capacity)
        self.front = ServiceFront(self.topo.controller, self.topo.hbms, self.keys_dir,
                                  self.issuer, self.metrics, self.cfg.hbm.page_bytes)
        wiring.connect(self.topo, self.front)
        self.server = ApiServer(self.cfg.api, self.front, self.front.authenticate,
                                self.metrics).start()
        if metrics_http:
            self.http = MetricsHttpServer(self.metrics, self.front.ready, self.cfg.metrics.host,
                                          self.cfg.metrics.port).start()
        return self

    def use_policy(self, policy: str, *, credits: bool | None = None) -> None:
        """A fresh controller on the same actors (emptied): for side-by-side policy runs."""
        assert self.topo is not None and self.front is not None
        topo = self.topo
        for h in [*topo.hbms.values(), *topo.pools.values()]:
            h.reset()
        topo.controller.close()
        topo.controller.kill()
        self.policy = policy
        self.credits = self.credits if credits is None else credits
        spec = ControllerSpec(policy=policy, per_link=self.cfg.credits.per_link,
                              per_session=self.cfg.credits.per_session, credits=self.credits,
                              tick_s=self.cfg.controller.tick_s)
        topo.controller = wiring.spawn_controller(spec, topo.directory)
        capacity = self.hbm_capacity or self.cfg.hbm.page_bytes * self.cfg.hbm.num_pages
        for name, handle in topo.pools.items():
            topo.controller.add_pool(name, handle)
        for name, handle in topo.hbms.items():
            topo.controller.add_hbm(name, handle, capacity, topo.hbm_pool[name])
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

    def stats(self) -> dict[str, Any]:
        assert self.topo is not None
        return self.topo.controller.stats()

    def stop(self, *, shutdown_ray: bool = False) -> None:
        if self.http is not None:
            self.http.stop()
        if self.server is not None:
            self.server.stop()
        if self.topo is not None:
            wiring.shutdown(self.topo)
        if self.front is not None:
            self.front.mover.close()
        if shutdown_ray:
            import ray

            ray.shutdown()

