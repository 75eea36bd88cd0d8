"""The API front's prepared loads (``runtime.loads.PreparedLoads``): a load goes when it is
served, when the engine released all its pages, after its TTL, or when its tenant holds
too many pages in prepared loads; another tenant's or session's id is never found."""

from __future__ import annotations

from agentkv_cluster.runtime.loads import PreparedLoad, PreparedLoads


def _load(tenant: str = "acme", session: str = "s", n: int = 2, at: float = 0.0,
          first: int = 0) -> PreparedLoad:
    return PreparedLoad(tenant, session, [bytes([first + i]) * 32 for i in range(n)], [], at=at)


def test_a_load_is_found_only_by_its_own_session_until_it_is_taken() -> None:
    loads = PreparedLoads()
    load_id = loads.add(_load())
    assert loads.get(load_id, "acme", "s", 1.0) is not None
    assert loads.get(load_id, "globex", "s", 1.0) is None
    assert loads.get(load_id, "acme", "other", 1.0) is None
    assert loads.take(load_id) and not loads.take(load_id)
    assert loads.get(load_id, "acme", "s", 1.0) is None and len(loads) == 0


def test_loads_expire_after_their_ttl() -> None:
    loads = PreparedLoads(ttl_s=10.0)
    old = loads.add(_load(at=0.0))
    assert loads.get(old, "acme", "s", 9.9) is not None
    assert loads.get(old, "acme", "s", 10.0) is None  # expired on read
    stale = loads.add(_load(at=1.0))
    loads.add(_load(at=20.0))  # a new load sweeps the expired ones
    assert len(loads) == 1 and loads.get(stale, "acme", "s", 20.0) is None


def test_a_release_of_all_its_pages_ends_a_load() -> None:
    loads = PreparedLoads()
    a = loads.add(_load(n=2, first=0))
    b = loads.add(_load(n=2, first=2))
    other = loads.add(_load(session="t", n=2, first=0))
    assert loads.released("acme", "s", [bytes([0]) * 32]) == 0  # one of a's two pages
    assert loads.released("acme", "s", [bytes([0]) * 32, bytes([1]) * 32]) == 1
    assert loads.get(a, "acme", "s", 0.0) is None
    assert loads.get(b, "acme", "s", 0.0) is not None
    assert loads.get(other, "acme", "t", 0.0) is not None  # another session's load stays


def test_a_tenant_over_its_page_cap_loses_its_oldest_loads_only() -> None:
    loads = PreparedLoads(max_keys=10)
    theirs = loads.add(_load(tenant="globex", n=8))
    mine = [loads.add(_load(n=4, first=4 * i)) for i in range(4)]  # 16 pages > 10
    kept = [i for i in mine if loads.get(i, "acme", "s", 0.0) is not None]
    assert kept == mine[-2:]  # 8 pages: the oldest two went
    assert loads.get(theirs, "globex", "s", 0.0) is not None


def test_empty_loads_count_against_the_cap_too() -> None:
    """``prepare_load([])`` kept an empty load that counted nothing: a client could hold
    any number of them until they expired."""
    loads = PreparedLoads(max_keys=10)
    ids = [loads.add(_load(n=0)) for _ in range(1000)]
    assert len(loads) == 10 and all(loads.get(i, "acme", "s", 0.0) for i in ids[-10:])
    for i in ids[-10:]:
        loads.take(i)
    assert len(loads) == 0 and loads.add(_load(n=10)) and len(loads) == 1


def test_forget_tenant_drops_its_loads() -> None:
    loads = PreparedLoads()
    loads.add(_load())
    keep = loads.add(_load(tenant="globex"))
    assert loads.forget_tenant("acme") == 1
    assert len(loads) == 1 and loads.get(keep, "globex", "s", 0.0) is not None
