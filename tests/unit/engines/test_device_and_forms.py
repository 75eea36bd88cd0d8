"""Where restored KV lands (the model's device, chosen without being told) and the form
each restored page came in (tiny geometry, stand-in models, no weights)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agentkv_cluster.engines.hf import (
    AdapterConfig,
    DynamicCache,
    HfKVAdapter,
    model_device,
    prefill,
)
from agentkv_cluster.engines.model import DeviceUnavailable, choose_device
from store.codecs import CodecSpec
from store.types import Codec
from tests.unit.engines.standins import (
    LAYERS,
    DictPageStore,
    StandInModel,
    random_cache,
    tiny_loaded,
)


def _adapter(model) -> HfKVAdapter:
    return HfKVAdapter(tiny_loaded(model), DictPageStore(),
                       AdapterConfig(page_tokens=16, tenant="t1"))


@pytest.mark.parametrize(("model", "want"), [
    (StandInModel("meta"), "meta"),  # its parameters say where it is
    (SimpleNamespace(device=torch.device("meta")), "meta"),  # a model that reports a device
    (torch.nn.Module(), "cpu"),  # no parameters
    (SimpleNamespace(config=None), "cpu"),
    (None, "cpu"),
])
def test_the_model_device_comes_from_the_model(model, want):
    assert model_device(model) == torch.device(want)


@pytest.mark.parametrize(("requested", "cuda", "want"), [
    (None, False, "cpu"),
    (None, True, "cuda"),  # a GPU is used when present, without being asked
    ("cpu", True, "cpu"),
    ("cuda:1", True, "cuda:1"),
])
def test_the_load_device_is_cuda_when_present_unless_told(requested, cuda, want):
    assert choose_device(requested, cuda) == torch.device(want)


def test_asking_for_cuda_without_a_gpu_is_a_typed_error():
    with pytest.raises(DeviceUnavailable, match="no CUDA device"):
        choose_device("cuda", False)


def test_restore_builds_the_cache_on_the_models_device():
    adapter = _adapter(StandInModel("meta"))  # stands for a model on an accelerator
    tokens = list(range(100, 140))
    adapter.store("s", tokens, random_cache(40), event_version=1)  # pages come from host memory
    restored = adapter.restore("s", tokens, recompute=False)
    assert restored.restored_tokens == 40
    assert {layer.keys.device.type for layer in restored.cache.layers} == {"meta"}
    assert {layer.values.device.type for layer in restored.cache.layers} == {"meta"}
    assert [layer.keys.dtype for layer in restored.cache.layers] == [torch.float32] * LAYERS


def test_prefill_sends_the_ids_to_the_models_device():
    model = StandInModel("meta")
    prefill(model, [1, 2, 3], DynamicCache())
    assert model.seen[0].device.type == "meta"


def test_restore_names_the_form_of_every_page():
    adapter = _adapter(StandInModel("cpu"))
    tokens = list(range(100, 140))  # pages [0, 16) [16, 32) [32, 40)
    adapter.store("s", tokens[:32], random_cache(32), event_version=1,
                  specs=(CodecSpec.full(), CodecSpec.int8()))
    int8 = adapter.restore("s", tokens, spec=CodecSpec.int8())
    assert int8.forms == (Codec.INT8, Codec.INT8, Codec.RECOMPUTE)
    assert not int8.exact
    full = adapter.restore("s", tokens)
    assert full.forms == (Codec.FULL, Codec.FULL, Codec.RECOMPUTE) and full.exact
    assert adapter.restore("s", tokens, recompute=False).forms == (Codec.FULL, Codec.FULL)
    nothing = adapter.restore("s", tokens, spec=CodecSpec.int4())
    assert nothing.forms == (Codec.RECOMPUTE,) * 3 and nothing.pages_hit == 0
