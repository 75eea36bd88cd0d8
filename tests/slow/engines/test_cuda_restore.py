"""Store and restore on a model that lives on CUDA (the loader puts it there by itself
where a GPU is present): the restored cache is on the GPU and equals the uninterrupted
run. Skipped on machines without a CUDA device."""

from __future__ import annotations

import pytest
import torch

from agentkv_cluster.engines.hf import (
    DynamicCache,
    drop_cache,
    greedy_decode,
    model_device,
    prefill,
)
from store.codecs import CodecSpec
from store.types import Codec
from tests.slow.engines.conftest import PAGE_TOKENS

pytestmark = [pytest.mark.slow, pytest.mark.gpu]


def test_restore_onto_cuda_equals_the_uninterrupted_run(loaded, adapter, doc_ids):
    model = loaded.model
    assert model_device(model).type == "cuda"  # chosen by load_model, not by the test
    context = doc_ids[:3 * PAGE_TOKENS + 10]  # three whole pages and a partial one
    cache = DynamicCache()
    prefill(model, context[:-1], cache)
    ref_logits = prefill(model, context[-1:], cache)[-1]
    ref_tokens = greedy_decode(model, cache, ref_logits, 16)

    cache = DynamicCache()
    prefill(model, context[:-1], cache)
    adapter.store("s1", context[:-1], cache, event_version=1,
                  specs=(CodecSpec.full(), CodecSpec.int8()))
    drop_cache(cache)
    restored = adapter.restore("s1", context[:-1])
    assert restored.forms == (Codec.FULL,) * 4 and restored.restored_tokens == len(context) - 1
    assert {layer.keys.device.type for layer in restored.cache.layers} == {"cuda"}
    assert {layer.values.dtype for layer in restored.cache.layers} == {loaded.dtype}
    logits = prefill(model, context[-1:], restored.cache)[-1]
    assert torch.allclose(logits, ref_logits, atol=1e-4)
    assert greedy_decode(model, restored.cache, logits, 16) == ref_tokens

    # A lossy working copy decoded on the host also lands on the GPU, and a context that
    # grew past the stored pages is recomputed there on top of them.
    lossy = adapter.restore("s1", context + [ref_tokens[0]], spec=CodecSpec.int8())
    assert lossy.forms == (Codec.INT8,) * 3 + (Codec.RECOMPUTE,)
    assert lossy.logits is not None and lossy.logits.device.type == "cuda"
    assert {layer.keys.device.type for layer in lossy.cache.layers} == {"cuda"}
