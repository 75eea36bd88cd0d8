"""What each Ray node of the cluster is to the service, decided from Ray's node records
alone (pure: no Ray calls): which nodes get a pool actor, how many HBM actors a node
gets, and the name a node's actors carry (``wiring.place`` acts on these)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Any

POOL_RESOURCE = "akv_pool"  # custom Ray resource of the nodes sized to host a pool

_HOST_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,46}[a-z0-9])?")


def pool_nodes(nodes: list[dict[str, Any]], cluster: list[dict[str, Any]] | None = None
               ) -> list[dict[str, Any]]:
    """The nodes of ``nodes`` that get a pool: those advertising ``akv_pool`` (their
    /dev/shm is sized for one), or all of them when no node of ``cluster`` (default:
    ``nodes``) advertises it (local demo, single-node clusters)."""
    def marked(n: dict[str, Any]) -> bool:
        return n.get("Resources", {}).get(POOL_RESOURCE, 0) >= 1

    if any(marked(n) for n in (nodes if cluster is None else cluster)):
        return [n for n in nodes if marked(n)]
    return list(nodes)


def hbm_slots(node: dict[str, Any], resource: str) -> tuple[str, int]:
    """(resource, count) of the HBM actors a node gets: one per GPU, else one per
    ``resource`` (``hbm.resource``, the CPU-only stand-in)."""
    res = node.get("Resources", {})
    if res.get("GPU", 0) >= 1:
        return "GPU", int(res["GPU"])
    return resource, int(res.get(resource, 0))


def _host(node: dict[str, Any]) -> str:
    return str(node.get("NodeManagerHostname", "")).split(".")[0].lower()


def stable_name(node: dict[str, Any], cluster: list[dict[str, Any]]) -> str | None:
    """A node name that survives restarts: its host name, when that is a plain DNS label no
    other live node shares (a StatefulSet pod in Kubernetes keeps it, so a restarted
    service reopens the same NVMe folder and shared-memory segment). None on a one-node
    cluster (its ``node0`` is stable already) and when several Ray nodes share a host
    (tests): those are numbered."""
    host = _host(node)
    if len(cluster) < 2 or not _HOST_LABEL.fullmatch(host) or re.fullmatch(r"node\d+", host):
        return None
    return host if sum(_host(n) == host for n in cluster) == 1 else None


def name_node(names: Mapping[str, str], node: dict[str, Any],
              cluster: list[dict[str, Any]]) -> str:
    """``stable_name``, unless a live node holds it already in ``names`` (Ray node id ->
    name, the nodes named so far); else the next free ``nodeN`` (a dead node's name is
    reused by the node that replaces it)."""
    live = {n["NodeID"] for n in cluster}
    holders = {name: nid for nid, name in names.items()}
    name = stable_name(node, cluster)
    if name is None or holders.get(name, node["NodeID"]) in live - {node["NodeID"]}:
        name = next(f"node{i}" for i in itertools.count(len(names))
                    if f"node{i}" not in holders)
    return name
