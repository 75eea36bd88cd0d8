"""Two adapters of one model on one page store, writing the same session: a page whose
key the store already holds under other bytes (the model in another dtype) is refused at
store time, and the first writer's pages stay intact."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from agentkv_cluster.engines.hf import (
    AdapterConfig,
    DynamicCache,
    HfKVAdapter,
    UnsupportedCache,
    greedy_decode,
    prefill,
)
from tests.slow.engines.conftest import PAGE_TOKENS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prompt(loaded, doc_ids):
    return doc_ids[:2 * PAGE_TOKENS + 9]


def _adapter(loaded, store) -> HfKVAdapter:
    return HfKVAdapter(loaded, store, AdapterConfig(page_tokens=PAGE_TOKENS, tenant="t1"))


def _stored(adapter, model, prompt):
    cache = DynamicCache()
    prefill(model, prompt, cache)
    return adapter.store("s1", prompt, cache, event_version=1)


def test_a_page_held_under_other_bytes_is_refused_and_the_first_stays(loaded, host_store,
                                                                      prompt):
    first = _adapter(loaded, host_store)
    _stored(first, loaded.model, prompt)
    half = dataclasses.replace(loaded, model=copy.deepcopy(loaded.model).to(torch.bfloat16),
                               dtype=torch.bfloat16)
    with pytest.raises(UnsupportedCache, match="other bytes"):
        _stored(_adapter(half, host_store), half.model, prompt)
    # The first writer's pages are still there, bit for bit: it restores all of them.
    restored = first.restore("s1", prompt, recompute=False)
    assert restored.restored_tokens == len(prompt)
    reference = DynamicCache()
    logits = prefill(loaded.model, prompt, reference)[-1]
    got = greedy_decode(loaded.model, restored.cache, logits, 8)
    assert got == greedy_decode(loaded.model, reference, logits, 8)


def test_the_same_bytes_under_a_held_key_are_not_written_again(loaded, host_store, prompt):
    _stored(_adapter(loaded, host_store), loaded.model, prompt)
    second = _adapter(loaded, host_store)
    receipt = _stored(second, loaded.model, prompt)
    assert (receipt.written, receipt.bytes_written) == (0, 0)
    assert len(receipt.pages) == 3
    assert second.restore("s1", prompt, recompute=False).restored_tokens == len(prompt)
