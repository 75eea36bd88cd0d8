"""Makes the actor classes remote (``actor_groups.remote_class``, the one ``ray.remote``) and
places them.

``deploy`` starts, on a running Ray cluster, one pool actor per node advertising
``akv_pool`` (every node when none does), one HBM actor
per GPU (or per ``hbm_slot`` resource on CPU-only nodes), the directory (Redis, or an
embedded one in its own actor) and the controller. ``deploy_local`` builds the same
objects in this process for tests and tools that need no Ray.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentkv_cluster.config import AgentKvConfig, nvme_root
from agentkv_cluster.runtime.actor_groups import remote_class
from agentkv_cluster.runtime.actor_watch import Liveness, liveness
from agentkv_cluster.runtime.controller_actor import ControllerActor, ControllerSpec
from agentkv_cluster.runtime.directory_glue import DirectoryShell, RedisSpec, open_directory
from agentkv_cluster.runtime.handles import (
    ActorGone,
    ActorSlow,
    ControllerHandle,
    DirectoryHandle,
    HbmHandle,
    PoolHandle,
)
from agentkv_cluster.runtime.hbm_actor import HbmActor, HbmSpec
from agentkv_cluster.runtime.node_roles import hbm_slots, name_node, pool_nodes
from agentkv_cluster.runtime.pool_actor import PoolActor, PoolSpec

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class Topology:
    controller: ControllerHandle
    directory: DirectoryHandle | RedisSpec
    pools: dict[str, PoolHandle] = field(default_factory=dict)
    hbms: dict[str, HbmHandle] = field(default_factory=dict)
    hbm_pool: dict[str, str] = field(default_factory=dict)
    pool_node: dict[str, str] = field(default_factory=dict)  # pool -> Ray node id
    hbm_node: dict[str, str] = field(default_factory=dict)  # HBM actor -> Ray node id
    workdir: Path = Path(".")
    pool_specs: dict[str, PoolSpec] = field(default_factory=dict)
    node_names: dict[str, str] = field(default_factory=dict)  # Ray node id -> "nodeN"
    spread: int = 0  # round-robin cursor for HBM actors on nodes without a pool
    # Pairs a join could not introduce in time (one of the two did not answer): each
    # join_new_nodes tries them again, until they meet or one of them is gone.
    unmet: list[tuple[Any, Any]] = field(default_factory=list)


class ControllerShell(ControllerActor):
    """ControllerActor that opens its directory in its own process."""

    def __init__(self, spec: ControllerSpec, directory: Any) -> None:
        super().__init__(spec, open_directory(directory))


class PoolShell(PoolActor):
    """PoolActor that opens its directory in its own process (Redis clients do not pickle)."""

    def __init__(self, spec: PoolSpec, directory: Any) -> None:
        super().__init__(spec, open_directory(directory))

    def node_id(self) -> str:
        """The Ray node this pool actor runs on (placement checks)."""
        return _ray().get_runtime_context().get_node_id()


def _ray():
    import ray

    return ray


def _affinity(node_id: str) -> dict[str, Any]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)}


def pool_spec(cfg: AgentKvConfig, name: str, workdir: Path) -> PoolSpec:
    nvme = nvme_root(cfg, workdir)
    keys = cfg.security.tenant_keys_dir or str(workdir / "keys")
    Path(keys).mkdir(parents=True, exist_ok=True)
    slots = max(1, cfg.pool.pool_bytes // cfg.pool.slot_bytes)
    # The absolute folder: two services whose relative state dirs read alike from other
    # working directories got one segment name (the second failed on the first's lock).
    tag = hashlib.blake2b(os.path.abspath(nvme / name).encode(), digest_size=6).hexdigest()
    return PoolSpec(name=name, host_slot_bytes=cfg.pool.slot_bytes, host_slots=slots,
                    nvme_dir=str(nvme / name), nvme_bytes=cfg.pool.nvme_bytes, keys_dir=keys,
                    shm_name=f"akv-{name}-{tag}", nvme_fsync=cfg.pool.fsync,
                    nvme_reserve_tombstones=cfg.pool.nvme_reserve_tombstones)


def hbm_spec(cfg: AgentKvConfig, name: str) -> HbmSpec:
    return HbmSpec(name=name, page_bytes=cfg.hbm.page_bytes, num_pages=cfg.hbm.num_pages,
                   device=cfg.hbm.device, landing_pages=cfg.hbm.landing_pages)


def controller_spec(cfg: AgentKvConfig, policy: str | None = None,
                    credits: bool = True) -> ControllerSpec:
    return ControllerSpec(policy=policy or cfg.controller.policy,
                          per_link=cfg.credits.per_link, per_session=cfg.credits.per_session,
                          credits=credits, tick_s=cfg.controller.tick_s,
                          landing_pages=cfg.hbm.landing_pages, page_bytes=cfg.hbm.page_bytes,
                          host_bytes=cfg.pool.pool_bytes, nvme_bytes=cfg.pool.nvme_bytes,
                          idle_session_s=cfg.controller.idle_session_s)


def spawn_pool(topo: Topology, spec: PoolSpec, node_id: str) -> PoolHandle:
    cls = remote_class(PoolShell)
    opts = {"num_cpus": 0, "max_concurrency": 8, "name": f"akv-pool-{spec.name}",
            **_affinity(node_id)}
    handle = PoolHandle.create(cls, spec.name, opts, spec, topo.directory)
    topo.pools[spec.name], topo.pool_node[spec.name], topo.pool_specs[spec.name] = \
        handle, node_id, spec
    return handle


def spawn_hbm(cfg: AgentKvConfig, name: str, node_id: str, kind: str) -> HbmHandle:
    spec = hbm_spec(cfg, name)
    opts: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 8, **_affinity(node_id)}
    if kind == "GPU":
        opts["num_gpus"] = 1
    else:
        opts["resources"] = {kind: 1}
    return HbmHandle.create(remote_class(HbmActor), name, opts, spec)


def deploy(cfg: AgentKvConfig, workdir: Path | None = None, *, policy: str | None = None,
           credits: bool = True, hbm_capacity: int | None = None) -> Topology:
    """Place the whole service on the running Ray cluster (every alive node; pools only
    on nodes advertising ``akv_pool`` when any does)."""
    ray = _ray()
    workdir = workdir or Path(tempfile.mkdtemp(prefix="agentkv-"))
    if cfg.directory.redis_url:
        directory: DirectoryHandle | RedisSpec = RedisSpec(url=cfg.directory.redis_url,
                                                           prefix=cfg.directory.prefix)
    else:
        directory = DirectoryHandle.create(remote_class(DirectoryShell), "directory",
                                           {"num_cpus": 0, "max_concurrency": 8, **_here()})
    controller = spawn_controller(controller_spec(cfg, policy, credits), directory)
    topo = Topology(controller=controller, directory=directory, workdir=workdir)
    nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: n["NodeID"])
    place(cfg, topo, nodes)
    connect(topo)
    announce(topo, list(topo.pools), list(topo.hbms), capacity_of(cfg, hbm_capacity))
    return topo


def _here() -> dict[str, Any]:
    """Pin to this (the head's) node: the controller must not die with a worker node."""
    return _affinity(_ray().get_runtime_context().get_node_id())


def spawn_controller(spec: ControllerSpec, directory: DirectoryHandle | RedisSpec
                     ) -> ControllerHandle:
    return ControllerHandle.create(remote_class(ControllerShell), "controller",
                                   {"num_cpus": 0, "max_concurrency": 64, **_here()}, spec,
                                   directory)


def capacity_of(cfg: AgentKvConfig, hbm_capacity: int | None = None) -> int:
    """The bytes the controller may place on one HBM actor (default: its whole arena)."""
    return hbm_capacity or cfg.hbm.page_bytes * cfg.hbm.num_pages


def announce(topo: Topology, pools: list[str], hbms: list[str], capacity: int) -> None:
    """Hand actors to the controller, which then places sessions and copies on them: only
    once they are wired, so nothing it sends them can reach an agent they have not met."""
    for name in pools:
        topo.controller.add_pool(name, topo.pools[name])
    for name in hbms:
        topo.controller.add_hbm(name, topo.hbms[name], capacity, topo.hbm_pool[name])


def place(cfg: AgentKvConfig, topo: Topology, nodes: list[dict[str, Any]],
          cluster: list[dict[str, Any]] | None = None) -> None:
    """Pool actors on the pool nodes, then HBM actors per GPU / hbm_slot on every node,
    recorded in ``topo``. ``nodes`` are new to ``topo`` (all of them at deploy time, those
    that joined later afterwards; ``cluster``: every live node).
    The controller learns of them from ``announce``, once they are wired.

    An HBM actor uses the pool on its own node when there is one (shared-memory hops),
    else the pools round-robin, so pool load spreads across the pool nodes.
    """
    cluster = nodes if cluster is None else cluster
    for node in nodes:
        topo.node_names[node["NodeID"]] = name_node(topo.node_names, node, cluster)
    for node in pool_nodes(nodes, cluster):
        pool = topo.node_names[node["NodeID"]]
        spawn_pool(topo, pool_spec(cfg, pool, topo.workdir), node["NodeID"])
    live = {n["NodeID"] for n in cluster}
    by_node = {node: pool for pool, node in topo.pool_node.items() if node in live}
    pools = sorted(by_node.values())  # never a pool whose node is gone
    for node in nodes:
        kind, count = hbm_slots(node, cfg.hbm.resource)
        for g in range(count):
            pool = by_node.get(node["NodeID"])
            if pool is None:
                pool, topo.spread = pools[topo.spread % len(pools)], topo.spread + 1
            name = f"{topo.node_names[node['NodeID']]}-hbm{g}"
            topo.hbms[name] = spawn_hbm(cfg, name, node["NodeID"], kind)
            topo.hbm_pool[name], topo.hbm_node[name] = pool, node["NodeID"]


def join_new_nodes(cfg: AgentKvConfig, topo: Topology, front: Any | None = None,
                   hbm_capacity: int | None = None) -> list[str]:
    """Place actors on Ray nodes that joined after ``deploy`` (GPU workers scaled up, a pool
    pod replaced), wire them to the rest, then announce them; returns the new actors' names
    (pools, then HBM actors). A node is placed once; an actor that dies while it is wired
    is skipped, and dead actors are the health watcher's business. Pairs it could not
    introduce in time are kept in ``Topology.unmet`` (``meet_unmet``)."""
    cluster = [n for n in _ray().nodes() if n.get("Alive")]
    new = sorted((n for n in cluster if n["NodeID"] not in topo.node_names),
                 key=lambda n: n["NodeID"])
    live = {n["NodeID"] for n in cluster}
    if not new or not (pool_nodes(new, cluster) or live & set(topo.pool_node.values())):
        return []  # nothing new, or no live pool to pair with yet: looked at again later
    before, before_hbms = dict(topo.pools), dict(topo.hbms)
    failed: Exception | None = None
    try:
        place(cfg, topo, new, cluster)
    except Exception as exc:  # noqa: BLE001 - re-raised below, once what it made is wired
        failed = exc
    made_pools = [p for p, h in topo.pools.items() if before.get(p) is not h]
    added = [h for h, handle in topo.hbms.items() if before_hbms.get(h) is not handle]
    if failed is not None:
        # Nodes that got no actor are looked at again on the next poll (e.g. the dead
        # pool they replace still held its actor name).
        made = {topo.pool_node[p] for p in made_pools} | {topo.hbm_node[h] for h in added}
        for node in new:
            if node["NodeID"] not in made:
                topo.node_names.pop(node["NodeID"], None)
        if not made:
            raise failed
    fresh = [p for p in made_pools if topo.pool_node[p] in live]  # new or replacing one
    for pool_name in fresh:  # new pools with the HBM actors from before
        for hbm in before_hbms.values():
            # a slow (starved) one is met too: skipped, it never met this pool at all
            if liveness(hbm, 5.0) is not Liveness.GONE:
                _meet(topo, hbm, topo.pools[pool_name])
    pools = [h for p, h in topo.pools.items() if topo.pool_node.get(p) in live]
    for name in added:  # the new HBM actors with every live pool and the front
        for other in [*pools, *([] if front is None else [front])]:
            _meet(topo, topo.hbms[name], other)
    announce(topo, fresh, added, capacity_of(cfg, hbm_capacity))
    if failed is not None:
        raise failed
    return fresh + added


def meet_unmet(topo: Topology) -> None:
    """Introduce the pairs an earlier join could not introduce in time (``Topology.unmet``);
    one still unanswered is kept for the next poll. The service runs this outside its
    topology lock: each try may wait ``introduce``'s whole timeout each way on a starved
    actor, and audit writes and policy swaps need that lock meanwhile. It changes no
    topology, only actors' peers, and only the join thread touches ``unmet``."""
    unmet, topo.unmet = topo.unmet, []
    for a, b in unmet:
        _meet(topo, a, b)


def _meet(topo: Topology, a: Any, b: Any) -> None:
    """``introduce``, unless one of the two died meanwhile (its node left: the controller's
    watcher forgets a dead actor, announced or not). A pair one of which did not answer in
    time (``ActorSlow``) is kept in ``topo.unmet`` for ``meet_unmet``: a placed node
    is never placed again, and until they meet, moves between the two find no peer."""
    try:
        introduce(a, b)
    except ActorSlow:
        topo.unmet.append((a, b))
        log.warning("introducing %s and %s timed out; trying again on the next join poll",
                    getattr(a, "name", a), getattr(b, "name", b))
    except ActorGone:
        pass


def introduce(a: Any, b: Any) -> None:
    """Introduce two NIXL agents to each other: actor handles, or local objects with
    endpoint()/introduce() (the API front, a test's Mover)."""
    a.introduce(b.endpoint())
    b.introduce(a.endpoint())


def connect(topo: Topology, front: Any | None = None) -> None:
    """Every HBM actor with every pool actor, and the API front with every HBM actor."""
    for hbm in topo.hbms.values():
        for pool in topo.pools.values():
            introduce(hbm, pool)
        if front is not None:
            introduce(hbm, front)


def restart_pool(topo: Topology, name: str) -> PoolHandle:
    """Kill-and-replace recovery: a fresh pool actor rebuilds its index from the tiers."""
    old = topo.pools[name]
    topo.controller.expect_restart(name)
    old.kill()
    handle = spawn_pool(topo, topo.pool_specs[name], topo.pool_node[name])
    for hbm in topo.hbms.values():
        introduce(hbm, handle)
    topo.controller.replace_pool(name, handle)
    return handle


def shutdown(topo: Topology) -> None:
    for hbm in [*topo.hbms.values()]:
        try:
            hbm.options(timeout_s=10).close()
        except Exception:  # noqa: BLE001, S110 - best effort at teardown
            pass
    for pool in topo.pools.values():
        try:
            pool.options(timeout_s=10).close()
        except Exception:  # noqa: BLE001, S110 - best effort at teardown
            pass
    try:
        topo.controller.options(timeout_s=10).close()
    except Exception:  # noqa: BLE001, S110 - best effort at teardown
        pass


def deploy_local(cfg: AgentKvConfig, workdir: Path, *, policy: str | None = None,
                 hbm_capacity: int | None = None) -> Topology:
    """The same objects in this process, no Ray: one pool, one HBM actor (tests, tools)."""
    directory = DirectoryHandle.local(DirectoryShell(), "directory")
    controller = ControllerHandle.local(ControllerActor(controller_spec(cfg, policy), directory),
                                        "controller")
    topo = Topology(controller=controller, directory=directory, workdir=workdir)
    pspec = pool_spec(cfg, "node0", workdir)
    topo.pools["node0"] = PoolHandle.local(PoolActor(pspec, directory), "node0")
    topo.pool_specs["node0"] = pspec
    hbm = HbmActor(hbm_spec(cfg, "node0-hbm0"))
    topo.hbms["node0-hbm0"] = HbmHandle.local(hbm, "node0-hbm0")
    topo.hbm_pool["node0-hbm0"] = "node0"
    connect(topo)
    announce(topo, ["node0"], ["node0-hbm0"], capacity_of(cfg, hbm_capacity))
    return topo
