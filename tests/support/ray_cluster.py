"""A real multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# One emulated GPU node: one HBM slot, a small object store (bytes never go through it).
NODE: dict[str, Any] = {"num_cpus": 1, "object_store_memory": 256 << 20,
                        "resources": {"hbm_slot": 1}}


@contextmanager
def ray_cluster(*workers: dict[str, Any], head: dict[str, Any] = NODE) -> Iterator[Any]:
    """A head node and one worker node per spec in ``workers`` (``Cluster.add_node``
    arguments); this process connected to it."""
    import ray
    from ray.cluster_utils import Cluster

    os.environ["RAY_AUTH_MODE"] = "disabled"
    cluster = Cluster(initialize_head=True, head_node_args=dict(head))
    for spec in workers:
        cluster.add_node(**spec)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
