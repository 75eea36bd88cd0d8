"""§5.2 verification on the real model: a corrupted working copy is caught at a
checkpoint and the output equals the full-precision run."""

from __future__ import annotations

import pytest
import torch

from agentkv_cluster.engines.hf import DynamicCache, greedy_decode, prefill
from agentkv_cluster.engines.verify import CheckpointVerifier, VerificationError, VerifyConfig
from store.codecs import CodecSpec
from tests.slow.engines.conftest import chat_prompt

pytestmark = pytest.mark.slow

NEW_TOKENS = 48
OBSERVATION = "\nTool result: the page table maps event ids to physical blocks.\n"


@pytest.fixture(scope="module")
def context(loaded, doc_ids):
    notes = loaded.tokenizer.decode(doc_ids[300:480])
    return chat_prompt(loaded, notes, "Summarise the notes in one sentence.")


@pytest.fixture(scope="module")
def full_precision(loaded, context):
    """Tokens of the run that never left full precision (context, observation, greedy)."""
    cache = DynamicCache()
    prefill(loaded.model, context, cache)
    logits = prefill(loaded.model, loaded.encode(OBSERVATION), cache)[-1]
    return greedy_decode(loaded.model, cache, logits, NEW_TOKENS)


def _stored(loaded, adapter, context):
    cache = DynamicCache()
    prefill(loaded.model, context, cache)
    adapter.store("s1", context, cache, event_version=1,
                  specs=(CodecSpec.full(), CodecSpec.int8(), CodecSpec.int4()))


def _corrupt(cache: DynamicCache) -> None:
    """Bit rot in the working copy: every key of every layer perturbed by its own scale."""
    gen = torch.Generator().manual_seed(7)
    for layer in cache.layers:
        layer.keys += torch.randn(layer.keys.shape, generator=gen) * layer.keys.std()


def test_corrupted_working_copy_is_rejected_and_output_is_full_precision(
        loaded, adapter, context, full_precision):
    _stored(loaded, adapter, context)
    working = adapter.restore("s1", context, spec=CodecSpec.int4()).cache
    _corrupt(working)
    reference = adapter.restore("s1", context, spec=CodecSpec.full()).cache
    verifier = CheckpointVerifier(loaded.model, VerifyConfig(max_new_tokens=NEW_TOKENS))
    out = verifier.generate(working=working, reference=reference, context_ids=context,
                            new_ids=loaded.encode(OBSERVATION))
    assert out.stats.rejects == 1
    assert out.stats.source == "reference"
    assert out.stats.checkpoints == 1
    assert list(out.tokens) == full_precision


def test_without_reference_copy_the_context_is_recomputed(loaded, adapter, context,
                                                          full_precision):
    _stored(loaded, adapter, context)
    working = adapter.restore("s1", context, spec=CodecSpec.int4()).cache
    _corrupt(working)
    verifier = CheckpointVerifier(loaded.model, VerifyConfig(max_new_tokens=NEW_TOKENS))
    out = verifier.generate(working=working, reference=None, context_ids=context,
                            new_ids=loaded.encode(OBSERVATION))
    assert (out.stats.rejects, out.stats.source) == (1, "recompute")
    assert out.stats.recomputed_tokens == len(context)
    assert list(out.tokens) == full_precision


def test_clean_int8_copy_accepts_exactly_the_tokens_that_agree_with_full_precision(
        loaded, adapter, context, full_precision):
    _stored(loaded, adapter, context)
    observation = loaded.encode(OBSERVATION)
    unverified_cache = adapter.restore("s1", context, spec=CodecSpec.int8()).cache
    logits = prefill(loaded.model, observation, unverified_cache)[-1]
    unverified = greedy_decode(loaded.model, unverified_cache, logits, NEW_TOKENS)
    agree = next((i for i, (a, b) in enumerate(zip(unverified, full_precision)) if a != b),
                 NEW_TOKENS)

    working = adapter.restore("s1", context, spec=CodecSpec.int8()).cache
    reference = adapter.restore("s1", context, spec=CodecSpec.full()).cache
    verifier = CheckpointVerifier(loaded.model, VerifyConfig(max_new_tokens=NEW_TOKENS,
                                                             checkpoint_every=8))
    out = verifier.generate(working=working, reference=reference, context_ids=context,
                            new_ids=observation)
    assert list(out.tokens) == full_precision
    # INT8 drafts are accepted up to the first near-tie it resolves differently, then the
    # reference takes over; with no divergence every token is a confirmed draft.
    assert out.stats.accepted == agree
    assert out.stats.rejects == (0 if agree == NEW_TOKENS else 1)
    assert out.stats.checkpoints == min(agree // 8 + 1, NEW_TOKENS // 8)


def test_verifier_rejects_mismatched_cache_lengths(loaded, context):
    verifier = CheckpointVerifier(loaded.model)
    cache = DynamicCache()
    prefill(loaded.model, context[:10], cache)
    with pytest.raises(VerificationError):
        verifier.generate(working=cache, reference=None, context_ids=context, new_ids=[1])
    with pytest.raises(VerificationError):
        verifier.generate(working=cache, reference=None, context_ids=context[:10], new_ids=[])
