"""The engine's page ids: (tenant, session, page id) -> the page table's gid, and back.

Events name pages by the engine's ids (``EventPlanner.translate``); one gid may carry
several, when sessions stored the same identity (one page, as ``store_pages`` keeps the
first copy). The reverse index lets a retired or erased page take its ids with it: they
used to stay for as long as the service ran, one per page ever stored.
"""

from __future__ import annotations

PidKey = tuple[str, str, int]  # (tenant, session, engine page id)


class PageIds:
    """Page ids -> gids with the ids of each gid (pure; the page table's lock guards it)."""

    def __init__(self) -> None:
        self._gid: dict[PidKey, int] = {}
        self._ids: dict[int, set[PidKey]] = {}

    def __len__(self) -> int:
        return len(self._gid)

    def get(self, key: PidKey) -> int | None:
        return self._gid.get(key)

    def __setitem__(self, key: PidKey, gid: int) -> None:
        old = self._gid.get(key)
        if old is not None and old != gid:
            self._unlink(key, old)
        self._gid[key] = gid
        self._ids.setdefault(gid, set()).add(key)

    def bind(self, key: PidKey, gid: int, keep: bool = False) -> None:
        """``key`` names ``gid``; ``keep``: unless it names another page already (a prefix
        lookup binds each identity's position, never an id ``store_pages`` gave a page)."""
        if not (keep and self._gid.get(key, gid) != gid):
            self[key] = gid

    def holders(self, gid: int) -> set[tuple[str, str]]:
        """The (tenant, session) pairs that named ``gid`` by a page id of theirs."""
        return {(tenant, session) for tenant, session, _ in self._ids.get(gid, ())}

    def drop_session(self, gid: int, tenant: str, session: str) -> None:
        """The session no longer holds ``gid``: its ids of it go."""
        for key in [k for k in self._ids.get(gid, ()) if k[:2] == (tenant, session)]:
            del self._gid[key]
            self._unlink(key, gid)

    def drop(self, gid: int) -> None:
        """Page ``gid`` is gone: every id of it goes."""
        for key in self._ids.pop(gid, ()):
            del self._gid[key]

    def forget_tenant(self, tenant: str) -> None:
        for key in [k for k in self._gid if k[0] == tenant]:
            self._unlink(key, self._gid.pop(key))

    def _unlink(self, key: PidKey, gid: int) -> None:
        ids = self._ids.get(gid)
        if ids is not None:
            ids.discard(key)
            if not ids:
                del self._ids[gid]
