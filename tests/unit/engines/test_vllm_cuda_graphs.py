"""Full CUDA graphs skip ``wait_for_layer_load`` on replay, so a forward would read layers
the connector has not copied yet. vLLM asks the connector class whether it needs
piecewise graphs (``requires_piecewise_for_cudagraph``); AgentKV's said no."""

from __future__ import annotations

import pytest

connector = pytest.importorskip("agentkv_cluster.engines.vllm.connector")


@pytest.mark.parametrize(("extra", "piecewise"), [
    ({}, True),  # embedded: layer-by-layer loads beside the forward
    ({"load_mode": "layerwise", "backend": "service", "service_address": "h:1"}, True),
    ({"load_mode": "async"}, False),  # the forward never waits for a load
    ({"backend": "service", "service_address": "h:1"}, False),  # async by default
    ({"background_io": "off"}, False),  # copies between forwards: nothing to wait for
])
def test_layer_by_layer_loads_need_piecewise_cuda_graphs(extra, piecewise):
    cls = connector.AgentKVConnector
    assert cls.requires_piecewise_for_cudagraph(extra) is piecewise
