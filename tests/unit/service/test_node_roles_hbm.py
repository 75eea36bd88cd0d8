"""How many HBM actors a node gets, from its Ray record alone (pure, no Ray): one per
whole GPU on a GPU node, else one per unit of the CPU-only stand-in resource."""

from __future__ import annotations

from agentkv_cluster.runtime import node_roles


def _node(**resources: float) -> dict:
    return {"NodeID": "a", "Resources": resources}


def test_a_gpu_node_gets_one_hbm_actor_per_gpu() -> None:
    assert node_roles.hbm_slots(_node(CPU=16, GPU=4), "hbm_slot") == ("GPU", 4)
    assert node_roles.hbm_slots(_node(GPU=8, hbm_slot=2), "hbm_slot") == ("GPU", 8)


def test_a_cpu_node_gets_one_per_stand_in_unit_or_none() -> None:
    assert node_roles.hbm_slots(_node(CPU=4, hbm_slot=3), "hbm_slot") == ("hbm_slot", 3)
    assert node_roles.hbm_slots(_node(CPU=4, GPU=0.5, hbm_slot=1), "hbm_slot") == ("hbm_slot", 1)
    assert node_roles.hbm_slots(_node(CPU=4), "hbm_slot") == ("hbm_slot", 0)
