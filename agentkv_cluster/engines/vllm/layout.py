"""vLLM's registered KV cache as the worker side addresses it: one tensor per layer, in
layer order, with vLLM's blocks at dim 0 (``kv[block_id]`` is the block the scheduler
names), every layer's block of one shape and dtype."""

from __future__ import annotations

import re

import torch

from agentkv_cluster.engines.vllm.blocks import BlockGeometry

_LAYER_RE = re.compile(r"layers\.(\d+)\.")


def _layer_order(name: str) -> tuple[int, str]:
    m = _LAYER_RE.search(name)
    return (int(m.group(1)) if m else 1 << 30, name)


def block_views(kv_caches: dict[str, torch.Tensor], num_blocks: int
                ) -> dict[str, torch.Tensor]:
    """Each layer's KV with vLLM's ``num_blocks`` blocks at dim 0. An attention backend
    whose kernel block is smaller than vLLM's block registers one row per kernel block,
    the rows of a block next to each other: they are grouped (``[num_blocks, rows per
    block, ...]``, as vLLM's own offloading connector does); any other row count is
    refused (indexing it with vLLM's block ids would read and write other blocks)."""
    out = {}
    for name, kv in kv_caches.items():
        rows = kv.shape[0]
        if rows == num_blocks:
            out[name] = kv
        elif rows > num_blocks and rows % num_blocks == 0:
            out[name] = kv.unflatten(0, (num_blocks, rows // num_blocks))
        else:
            raise ValueError(f"AgentKV: KV cache {name} has {rows} rows at dim 0 for "
                             f"{num_blocks} vLLM blocks; its layout is not supported")
    return out


def ordered_layers(kv_caches: dict[str, torch.Tensor]
                   ) -> tuple[list[str], list[torch.Tensor], BlockGeometry]:
    """The layers' names and tensors in layer order, and the geometry of their block."""
    names = sorted(kv_caches, key=_layer_order)
    layers = [kv_caches[n] for n in names]
    first = layers[0]
    for t in layers:
        if t.shape[1:] != first.shape[1:] or t.dtype != first.dtype:
            raise ValueError("AgentKV needs every layer's KV block in one shape and dtype")
    geometry = BlockGeometry(layers=len(layers), per_layer=tuple(first.shape[1:]),
                             dtype=str(first.dtype).removeprefix("torch."))
    return names, layers, geometry
