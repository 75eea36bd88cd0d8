"""`ServicePageStore` over a session that answers as the service does when it no longer
holds a page (``not_found``): the page is a miss, then forgotten, so the adapter's next
store sends it again instead of trusting a copy that is gone."""

from __future__ import annotations

from agentkv_cluster.api.protocol import PageLostError, RemoteError
from agentkv_cluster.engines.hf import AdapterConfig, HfKVAdapter
from agentkv_cluster.engines.page_store import ServicePageStore
from agentkv_cluster.lifecycle.identity import PageIdentity
from store.types import Lookup
from tests.unit.engines.standins import StandInModel, random_cache, tiny_loaded


class RetiringSession:
    """The engine side of `SessionClient`; ``retire`` drops a page as the service does
    when it evicts or retires one."""

    def __init__(self) -> None:
        self.pages: dict[bytes, bytes] = {}
        self.stores = 0

    def store_pages(self, pages: list[dict]) -> list[bytes]:
        self.stores += len(pages)
        keys = [b"svc-" + page["identity"][-8:] + bytes([self.stores % 256]) for page in pages]
        self.pages.update(zip(keys, (page["data"] for page in pages)))
        return keys

    def load(self, keys: list[bytes]) -> list[bytes]:
        if any(key not in self.pages for key in keys):
            raise RemoteError("not_found", "page is not stored in this session")
        return [self.pages[key] for key in keys]

    def release(self, keys: list[bytes]) -> int:
        return sum(self.pages.pop(key, None) is not None for key in keys)

    def retire(self, key: bytes) -> None:
        del self.pages[key]


def test_a_page_the_service_retired_is_sent_again_by_the_next_store():
    session = RetiringSession()
    store = ServicePageStore(session)
    adapter = HfKVAdapter(tiny_loaded(StandInModel()), store,
                          AdapterConfig(page_tokens=16, tenant="t1"))
    tokens = list(range(10, 50))
    adapter.store("s", tokens, random_cache(40), event_version=1)
    first = adapter.pages("s")[0].key
    session.retire(next(iter(session.pages)))  # the service drops the first page
    assert adapter.restore("s", tokens).restored_tokens == 0  # recomputed
    assert first not in store and store.get(first) == (Lookup.MISS, None)
    again = adapter.store("s", tokens, random_cache(40), event_version=2)
    assert again.written == 1 and session.stores == 4  # only the page that was gone
    assert adapter.restore("s", tokens, recompute=False).restored_tokens == 40


def _identity() -> PageIdentity:
    return PageIdentity(model_version="m1", adapter_version="", tokenizer_version="t1",
                        rope_config="theta=1e4", tenant="t1", session="s", start=0, end=16,
                        event_version=1)


class LosingSession(RetiringSession):
    """Answers a page whose only copy died with its HBM actor as the service does:
    ``page_lost`` (``PageLostError``), not ``not_found``."""

    def __init__(self) -> None:
        super().__init__()
        self.lost: set[bytes] = set()

    def load(self, keys: list[bytes]) -> list[bytes]:
        if any(key in self.lost for key in keys):
            raise PageLostError("page_lost", "1 page(s) have no copy left; re-prefill them")
        return super().load(keys)


def test_a_page_the_service_lost_is_a_miss_and_sent_again():
    session = LosingSession()
    store = ServicePageStore(session)
    store.put(b"k" * 32, b"kv-bytes", identity=_identity())
    session.lost.add(next(iter(session.pages)))
    assert store.get(b"k" * 32) == (Lookup.MISS, None)  # was: PageLostError raised
    assert b"k" * 32 not in store  # forgotten: the next put stores it again
    store.put(b"k" * 32, b"kv-bytes", identity=_identity())
    assert session.stores == 2
