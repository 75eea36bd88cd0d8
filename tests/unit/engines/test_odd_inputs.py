"""Odd inputs to the adapter: nothing to restore, a batch where one sequence belongs, ids
outside the vocabulary, no forms to store in, a page that went bad (stand-ins, no weights)."""

from __future__ import annotations

import pytest
import torch

from agentkv_cluster.engines.hf import (
    AdapterConfig,
    CorruptPage,
    DynamicCache,
    EmptyInput,
    HfKVAdapter,
    InvalidForms,
    InvalidTokens,
    UnsupportedCache,
    greedy_decode,
    prefill,
)
from agentkv_cluster.engines.verify import CheckpointVerifier, VerifyConfig
from store.codecs import CodecSpec
from store.types import Codec
from tests.unit.engines.standins import (
    VOCAB,
    DictPageStore,
    StandInModel,
    random_cache,
    tiny_loaded,
)

TOKENS = list(range(10, 50))  # 40 tokens: pages [0, 16) [16, 32) [32, 40)


@pytest.fixture
def store() -> DictPageStore:
    return DictPageStore()


@pytest.fixture
def adapter(store) -> HfKVAdapter:
    return HfKVAdapter(tiny_loaded(StandInModel()), store,
                       AdapterConfig(page_tokens=16, tenant="t1"))


def test_restoring_no_tokens_is_refused(adapter):
    with pytest.raises(EmptyInput, match="no tokens to restore"):
        adapter.restore("s", [])


def test_a_batch_of_ids_is_refused_and_a_flat_tensor_is_taken(adapter):
    batch = torch.tensor([TOKENS])  # what tokenizer(..., return_tensors="pt") gives
    with pytest.raises(InvalidTokens, match=r"shape \(1, 40\).*ids\[0\]"):
        adapter.store("s", batch, random_cache(40), event_version=1)
    with pytest.raises(InvalidTokens, match=r"shape \(1, 40\)"):
        adapter.restore("s", batch)
    with pytest.raises(InvalidTokens, match="integers"):
        adapter.restore("s", [1.5, 2.0])
    adapter.store("s", torch.tensor(TOKENS), random_cache(40), event_version=1)
    restored = adapter.restore("s", TOKENS, recompute=False)  # same pages as from a list
    assert restored.restored_tokens == 40


@pytest.mark.parametrize("bad", [-1, VOCAB])
def test_ids_outside_the_vocabulary_are_refused_before_the_model_runs(bad):
    model = StandInModel()
    with pytest.raises(InvalidTokens, match=f"token id {bad} is outside"):
        prefill(model, [1, bad], DynamicCache())
    assert model.seen == []


@pytest.mark.parametrize("specs", [(), (CodecSpec.recompute(),)])
def test_storing_in_no_form_that_holds_kv_is_refused(adapter, store, specs):
    with pytest.raises(InvalidForms):
        adapter.store("s", TOKENS, random_cache(40), event_version=1, specs=specs)
    assert not store.blobs


def test_a_corrupt_page_is_reported_once_then_recomputed(adapter, store):
    receipt = adapter.store("s", TOKENS, random_cache(40), event_version=1)
    bad = receipt.pages[1]
    store.blobs[bad.key][-64] ^= 0x40
    with pytest.raises(CorruptPage, match=r"\[16, 32\)"):
        adapter.restore("s", TOKENS)
    assert bad.key not in store and bad not in adapter.pages("s")
    again = adapter.restore("s", TOKENS)  # from the bad page on, recomputed
    assert (again.restored_tokens, again.recomputed_tokens) == (16, 24)
    assert again.forms == (Codec.FULL, Codec.RECOMPUTE, Codec.RECOMPUTE)


def test_greedy_decoding_of_no_tokens_is_empty():
    logits = torch.zeros(VOCAB)
    assert greedy_decode(StandInModel(), DynamicCache(), logits, 0) == []
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_decode(StandInModel(), DynamicCache(), logits, -1)


@pytest.mark.parametrize(("change", "said"), [
    ({"num_hidden_layers": 3}, "layers 2 -> 3"),  # another model put in its place
    ({"num_key_value_heads": 4}, "kv_heads 2 -> 4"),
    ({"dtype": torch.float16}, "dtype torch.float32 -> torch.float16"),  # cast after loading
])
def test_a_model_that_changed_since_loading_is_refused_before_restoring(store, change, said):
    model = StandInModel()
    adapter = HfKVAdapter(tiny_loaded(model), store, AdapterConfig(page_tokens=16))
    adapter.store("s", TOKENS, random_cache(40), event_version=1)
    if "dtype" in change:
        model.to(change["dtype"])
    else:
        vars(model.config).update(change)
    with pytest.raises(UnsupportedCache, match=f"changed since it was loaded \\({said}\\)"):
        adapter.restore("s", TOKENS)
    with pytest.raises(UnsupportedCache, match="changed since it was loaded"):
        adapter.store("t", TOKENS, random_cache(40), event_version=1)


def test_the_verifier_takes_ids_as_a_tensor():
    verifier = CheckpointVerifier(StandInModel(), VerifyConfig(max_new_tokens=3))
    out = verifier.generate(working=DynamicCache(), reference=DynamicCache(), context_ids=[],
                            new_ids=torch.tensor([5, 6]))
    assert out.tokens == (0, 0, 0) and out.stats.rejects == 0  # the stand-in's argmax is 0
    with pytest.raises(InvalidTokens):
        verifier.generate(working=DynamicCache(), reference=DynamicCache(), context_ids=[],
                          new_ids=torch.tensor([[5, 6]]))
