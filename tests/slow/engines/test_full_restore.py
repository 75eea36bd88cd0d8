"""Full-precision store / drop / restore on the real model equals the uninterrupted run."""

from __future__ import annotations

import pytest
import torch

from agentkv_cluster.engines.hf import (
    ContextTooLong,
    CorruptPage,
    DynamicCache,
    UnsupportedCache,
    cache_to_kv,
    drop_cache,
    greedy_decode,
    prefill,
)
from store.codecs import CodecSpec
from tests.slow.engines.conftest import PAGE_TOKENS, chat_prompt

pytestmark = pytest.mark.slow

OBSERVATION = "\nTool result: 12 * 7 = 84\n"


@pytest.fixture(scope="module")
def prompt(loaded, doc_ids):
    notes = loaded.tokenizer.decode(doc_ids[:220])
    return chat_prompt(loaded, notes, "What does AgentKV decide for each KV page?")


@pytest.fixture(scope="module")
def uninterrupted(loaded, prompt):
    """Next-token logits and 64 greedy tokens with the cache never leaving the model.

    The context is prefilled in the same two calls as in the interrupted run (all but
    the last token, then the last token) so that the only difference is the interruption.
    """
    cache = DynamicCache()
    prefill(loaded.model, prompt[:-1], cache)
    logits = prefill(loaded.model, prompt[-1:], cache)[-1]
    return logits, greedy_decode(loaded.model, cache, logits, 64)


def test_full_restore_matches_uninterrupted_logits_and_64_greedy_tokens(
        loaded, adapter, prompt, uninterrupted):
    ref_logits, ref_tokens = uninterrupted
    cache = DynamicCache()
    prefill(loaded.model, prompt[:-1], cache)
    receipt = adapter.store("s1", prompt[:-1], cache, event_version=3)
    drop_cache(cache)
    assert all(layer.keys is None for layer in cache.layers)  # the model holds no KV now
    assert receipt.written == -(-(len(prompt) - 1) // PAGE_TOKENS)

    restored = adapter.restore("s1", prompt[:-1])
    assert (restored.restored_tokens, restored.recomputed_tokens) == (len(prompt) - 1, 0)
    logits = prefill(loaded.model, prompt[-1:], restored.cache)[-1]
    assert (logits - ref_logits).abs().max().item() <= 1e-5
    assert greedy_decode(loaded.model, restored.cache, logits, 64) == ref_tokens


def test_missing_page_restores_longest_prefix_and_recomputes_rest(loaded, adapter, prompt,
                                                                  uninterrupted, host_store):
    ref_logits, _ = uninterrupted
    cache = DynamicCache()
    prefill(loaded.model, prompt[:-1], cache)
    adapter.store("s1", prompt[:-1], cache, event_version=1)
    drop_cache(cache)
    host_store.delete(adapter.pages("s1")[2].key)  # evicted from the host tier

    restored = adapter.restore("s1", prompt)
    assert restored.restored_tokens == 2 * PAGE_TOKENS
    assert restored.recomputed_tokens == len(prompt) - 2 * PAGE_TOKENS
    assert restored.cache.get_seq_length() == len(prompt)
    # The recomputed suffix is one prefill call instead of two: float rounding differs a little.
    assert (restored.logits - ref_logits).abs().max().item() <= 1e-4


def test_pages_carry_identity_and_are_not_shared_across_sessions(loaded, adapter, prompt):
    cache = DynamicCache()
    prefill(loaded.model, prompt, cache)
    receipt = adapter.store("s1", prompt, cache, event_version=5,
                            specs=(CodecSpec.full(), CodecSpec.int8()))
    first = receipt.pages[0].identity
    assert (first.model_version, first.tokenizer_version, first.rope_config) == (
        loaded.model_version, loaded.tokenizer_version, loaded.rope_config)
    assert (first.tenant, first.session, first.start, first.end, first.event_version) == (
        "t1", "s1", 0, PAGE_TOKENS, 5)
    assert "100000" in first.rope_config  # SmolLM2's RoPE theta is part of the identity
    # One page per 64 tokens and form (full, INT8), each under its own key.
    assert len({p.key for p in receipt.pages}) == len(receipt.pages) == 2 * -(
        -len(prompt) // PAGE_TOKENS)

    other = adapter.restore("s2", prompt, recompute=False)
    assert (other.restored_tokens, other.pages_hit) == (0, 0)


def test_storing_again_writes_only_pages_that_changed(loaded, adapter, prompt):
    cache = DynamicCache()
    prefill(loaded.model, prompt, cache)
    first = adapter.store("s1", prompt, cache, event_version=1)
    again = adapter.store("s1", prompt, cache, event_version=2)
    extra = loaded.encode(OBSERVATION)
    prefill(loaded.model, extra, cache)
    grown = adapter.store("s1", prompt + extra, cache, event_version=3)
    full_pages = len(prompt) // PAGE_TOKENS
    assert again.written == 0 and again.bytes_written == 0
    # Whole pages are reused; the old partial tail page and new pages are written.
    assert grown.written == len(grown.pages) - full_pages
    assert len(first.pages) == full_pages + 1


def test_bad_inputs_raise_specific_errors(loaded, adapter, prompt, host_store):
    with pytest.raises(UnsupportedCache):
        cache_to_kv(DynamicCache())
    cache = DynamicCache()
    prefill(loaded.model, prompt, cache)
    with pytest.raises(UnsupportedCache):
        adapter.store("s1", prompt[:-1], cache, event_version=1)
    adapter.store("s1", prompt, cache, event_version=1)
    # Swap two pages' bytes in the pool: the page's embedded identity no longer matches.
    a, b = adapter.pages("s1")[:2]
    _, blob_b = host_store.get(b.key)
    blob_b = bytes(blob_b)
    host_store.delete(a.key)
    host_store.put(a.key, blob_b)
    with pytest.raises(CorruptPage):
        adapter.restore("s1", prompt)
    # The bad page is dropped: the next restore recomputes from it, and a store rewrites it.
    assert a.key not in host_store and a not in adapter.pages("s1")
    assert adapter.restore("s1", prompt, recompute=False).restored_tokens == 0
    assert adapter.store("s1", prompt, cache, event_version=1).written == 1
    assert adapter.restore("s1", prompt, recompute=False).restored_tokens == len(prompt)
    with pytest.raises(ValueError):
        adapter.store("s1", prompt, cache, event_version=2, specs=(CodecSpec.recompute(),))
    k, _ = cache_to_kv(cache)
    assert tuple(k.shape) == (loaded.num_layers, loaded.kv_heads, len(prompt), loaded.head_dim)
    assert torch.equal(k[:, :, :4], torch.stack([lay.keys[0, :, :4] for lay in cache.layers]))


def test_a_tampered_full_page_is_refused_not_restored_as_exact(loaded, adapter, prompt,
                                                               host_store):
    cache = DynamicCache()
    prefill(loaded.model, prompt, cache)
    adapter.store("s1", prompt, cache, event_version=1)
    page = adapter.pages("s1")[1]
    slot, length = host_store._slots[page.key]
    _, blob = host_store.get(page.key)
    blob = bytearray(blob)
    blob[length - 4096] ^= 0x40  # one bit of a V element, rewritten in place in the pool
    host_store.pool.write(slot, bytes(blob))
    with pytest.raises(CorruptPage, match="checksum"):
        adapter.restore("s1", prompt)
    # A context longer than the model's 8192 positions is refused before any page is read.
    with pytest.raises(ContextTooLong):
        adapter.restore("s1", prompt * (8192 // len(prompt) + 1))
