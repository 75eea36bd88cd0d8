"""One real SmolLM2-135M per test session (loading takes ~20-35 s on 2 cores)."""

from __future__ import annotations

import os
import uuid

import pytest

from agentkv_cluster.engines.hf import AdapterConfig, HfKVAdapter
from agentkv_cluster.engines.model import LoadedModel, load_model
from agentkv_cluster.engines.page_store import HostPoolPageStore
from agentkv_cluster.engines.quality import context_text

PAGE_TOKENS = 64


@pytest.fixture(scope="session")
def loaded() -> LoadedModel:
    return load_model()


@pytest.fixture(scope="session")
def doc_ids(loaded: LoadedModel) -> list[int]:
    """Token ids of real text: the paper digest (or this repo's docs without ../shared)."""
    text, _ = context_text()
    return loaded.encode(text)


def make_store(loaded: LoadedModel, slots: int = 48) -> HostPoolPageStore:
    """A fresh shared-memory host pool (real /dev/shm segment); the caller closes it."""
    slot = PAGE_TOKENS * loaded.kv_bytes_per_token + (64 << 10)
    return HostPoolPageStore.create(f"agentkv-test-eng-{os.getpid()}-{uuid.uuid4().hex[:8]}",
                                    slot, slots)


@pytest.fixture
def host_store(loaded: LoadedModel):
    store = make_store(loaded)
    yield store
    store.close()


@pytest.fixture
def adapter(loaded: LoadedModel, host_store: HostPoolPageStore) -> HfKVAdapter:
    return HfKVAdapter(loaded, host_store, AdapterConfig(page_tokens=PAGE_TOKENS, tenant="t1"))


def chat_prompt(loaded: LoadedModel, notes: str, question: str) -> list[int]:
    """A chat-formatted prompt ending where the assistant starts to answer."""
    messages = [
        {"role": "system", "content": "Answer briefly, using only the notes."},
        {"role": "user", "content": f"Notes:\n{notes}\n\nQuestion: {question}"},
    ]
    ids = loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                               tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
