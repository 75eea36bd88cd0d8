"""Sealing for the keyed store (``store.kv``): one tenant's slot identities and bindings,
sealing a value into a record buffer, opening records, and telling what a stored NVMe
record is (for the checks and the pruning of an open: ``RecordKind``, ``open_plan``).

A sealed NVMe get reads the whole record (the shard verifies it, reading stripes on two
threads) and then opens its chunks on every core. Two overlapped variants were tried and
were not faster, cold, interleaved with this one in one process: each thread reading a
chunk and then opening it (16 MiB: 27.6 vs 25.0 ms; 2 MiB: 3.1 vs 2.6 ms; load 4.6), and
opening each chunk from a shard callback as soon as its 1 MiB stripes were in (16 MiB:
26.0 vs 23.8 ms and 30.2 vs 29.7 ms; 2 MiB: 2.9 vs 3.1 ms; load 8-9). Unsealed: 19.4-20.4
and 2.3 ms.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from security.chunked import (
    HEAD_BYTES,
    MAGIC,
    PREAMBLE_BYTES,
    SLOT_ID_BYTES,
    VERSION,
    Binding,
    ChunkedSealer,
    SealedMeta,
)
from security.errors import InvalidSeal, KeyUnavailable
from security.keyring import TenantKeyring
from security.record_layout import PRE
from store.host_pool import HostPool, SlotEmpty, TornRead
from store.kv_types import ForeignKeyring, ForeignTenant, SealingMismatch, fit_out
from store.nvme import NvmeShard
from store.nvme import format as fmt
from store.types import Lookup, Tier

_TORN_RETRIES = 3
_SLOT_DOMAIN = b"agentkv/kv-slot/v1\0"
_PAGE_DOMAIN = b"agentkv/kv-page/v1\0"

__all__ = ["RecordKind", "Sealing", "TenantSeal", "looks_sealed", "open_plan"]


class RecordKind(enum.Enum):
    """What a stored NVMe record is, as a store opening the directory sees it."""

    PLAIN = "plain"  # not a sealed record under its own slot identity: an unsealed value
    SEALED = "sealed"  # looks sealed (an unsealed store does not try to open it)
    OURS = "ours"  # sealed for this tenant under a live key
    DEAD = "dead"  # looks sealed but opens under no live key (erased), or unreadable
    FOREIGN = "foreign"  # sealed for another live tenant of the keyring
    UNKNOWN = "unknown"  # intact, opens under no key of the keyring, and no erasure it records
    #                      explains why: sealed under another keyring's keys for the tenant


def looks_sealed(nkey: bytes, head: Any) -> bool:
    """Whether a record (``head``: its first bytes) is laid out as a sealed one stored under
    its own slot identity: a 32-byte key repeated in a version-2 preamble. Nothing is
    verified; an unsealed value would have to carry its own key at bytes 32..64."""
    pre = bytes(memoryview(head)[:PREAMBLE_BYTES])
    return (len(nkey) == SLOT_ID_BYTES and len(pre) == PREAMBLE_BYTES
            and pre[:4] == MAGIC and pre[4:8] == bytes((VERSION, 0, 0, 0))
            and pre[PREAMBLE_BYTES - SLOT_ID_BYTES:] == nkey)


def open_plan(directory: str, kinds: Mapping[bytes, RecordKind], sealed: bool) -> list[bytes]:
    """The records an open retires (sealed: those that no longer open), or the typed error
    that stops it before anything is touched: ``SealingMismatch`` for records written
    with sealing set the other way (plain ones first), ``ForeignTenant``, and
    ``ForeignKeyring`` for records nothing in the keyring accounts for (retiring them
    would delete every value of a directory opened with the wrong keyring)."""
    count = Counter(kinds.values())
    plain = count[RecordKind.PLAIN]
    looked_sealed = len(kinds) - plain
    wrong = plain if sealed else looked_sealed
    if wrong:
        raise SealingMismatch(directory, sealed_store=sealed, sealed=looked_sealed, plain=plain)
    if count[RecordKind.FOREIGN]:
        raise ForeignTenant(f"the NVMe directory {directory} holds "
                            f"{count[RecordKind.FOREIGN]} records of another tenant")
    if count[RecordKind.UNKNOWN]:
        raise ForeignKeyring(f"the NVMe directory {directory} holds {count[RecordKind.UNKNOWN]}"
                             f" sealed records that open under no key of this keyring, which "
                             f"records no erasure of their keys (nothing was changed): open it "
                             f"with the keyring it was written with")
    return [key for key, kind in kinds.items() if kind is RecordKind.DEAD]


@dataclass(frozen=True, kw_only=True)
class Sealing:
    keyring: TenantKeyring
    tenant: str

    def __post_init__(self) -> None:
        if not isinstance(self.keyring, TenantKeyring):
            raise TypeError(f"Sealing.keyring must be a security.keyring.TenantKeyring, not "
                            f"{type(self.keyring).__name__}")
        if not isinstance(self.tenant, str) or not self.tenant:
            raise TypeError(f"Sealing.tenant must be a tenant's name, not {self.tenant!r:.40}")


class TenantSeal:
    """Seals and opens one tenant's values; every failure to open is ``InvalidSeal``."""

    def __init__(self, sealing: Sealing) -> None:
        if not isinstance(sealing, Sealing):  # KVStore(sealing=...): a clear error, not later
            raise TypeError(f"sealing must be a store.kv_sealing.Sealing (or None), not "
                            f"{type(sealing).__name__}")
        self.sealing = sealing
        self.tenant = sealing.tenant
        self._sealer = ChunkedSealer(sealing.keyring)
        self._explains: tuple[bool, frozenset[bytes]] | None = None  # ``_erased_or_ours``

    # -- identity ---------------------------------------------------------------------------
    def slot_id(self, key: bytes) -> bytes:
        """The record's blinded identity (in the clear in its preamble; also its NVMe key)."""
        secret = self.sealing.keyring.blind_secret(self.tenant)
        return hmac.new(secret, _SLOT_DOMAIN + key, hashlib.sha256).digest()

    def nvme_key(self, key: bytes, nvme: NvmeShard) -> bytes | None:
        """``key``'s record key in ``nvme`` (its ``slot_id``); None once the tenant was erased
        (no key of it is left, the blinding secret included): then none of its records
        opens again, and all of them leave ``nvme`` now (every record there is the
        tenant's: the store's open refused any other)."""
        try:
            return self.slot_id(key)
        except KeyUnavailable:
            if self.sealing.keyring.has_keys(self.tenant):
                raise  # a key source that failed to read, not an erasure
        nvme.prune(lambda *_: False, 0)
        return None

    def binding(self, key: bytes, tier: Tier, generation: int | None = None) -> Binding:
        ring = self.sealing.keyring
        return Binding(tenant=self.tenant,
                       generation=ring.current_generation(self.tenant) if generation is None
                       else generation,
                       tier=int(tier), slot_id=self.slot_id(key),
                       digest=hashlib.sha256(_PAGE_DOMAIN + key).digest())

    # -- sealing ----------------------------------------------------------------------------
    def seal_into(self, out: Any, plain: Any, key: bytes, tier: Tier) -> int:
        """Seal ``plain`` into ``out``; returns the record's (padded) length."""
        return self._sealer.seal_into(out, plain, self.binding(key, tier))

    # -- opening ----------------------------------------------------------------------------
    def _meta(self, record: Any, tier: Tier) -> SealedMeta:
        # the key id names tenant and generation; a record of any live one opens
        meta = self._sealer.read_meta(record, int(tier))
        if meta.tenant != self.tenant:
            raise InvalidSeal("another tenant's record")
        return meta

    def open(self, key: bytes, tier: Tier, record: Any, out: np.ndarray | None) -> memoryview:
        """Open a whole record into ``out`` (a flat uint8 array from ``out_arg``, or None
        for a new buffer); ``BadOutBuffer`` if it is too small."""
        meta = self._meta(record, tier)
        if out is not None:
            out = fit_out(out, meta.nbytes)
        return self._sealer.open_into(record, self.binding(key, tier, meta.generation), out,
                                      meta)

    def kind(self, nkey: bytes, head: memoryview | None, length: int,
             scratch: np.ndarray) -> RecordKind:
        """What a stored NVMe record (``head``: its first bytes, None if they cannot be read;
        ``length`` in all) is to this tenant. ``scratch`` stands in for the record (only its
        head is written; a record larger than it, from a store with larger slots, gets an
        untouched buffer of its own)."""
        if head is None:
            return RecordKind.DEAD
        if not looks_sealed(nkey, head):
            return RecordKind.PLAIN
        if head.nbytes < HEAD_BYTES:
            return RecordKind.DEAD
        record = _room(scratch, length)
        record[:HEAD_BYTES] = np.frombuffer(head, np.uint8)
        try:
            meta = self._sealer.read_meta(record, int(Tier.NVME))
        except InvalidSeal:
            return RecordKind.DEAD if self._erased_or_ours(head) else RecordKind.UNKNOWN
        if meta.tenant != self.tenant:  # opens, for another live tenant: not ours to drop
            return RecordKind.FOREIGN
        return RecordKind.OURS if hmac.compare_digest(meta.slot_id, nkey) else RecordKind.DEAD

    def _erased_or_ours(self, head: memoryview) -> bool:
        """Whether the keyring accounts for a record that does not open: its key id names
        a live generation of the tenant (the record is damaged) or an erased one, or the
        keyring records an erasure of the whole tenant (whose key ids died with it)."""
        if self._explains is None:  # once per survey (``survey`` resets it)
            ring = self.sealing.keyring
            erased = [g for ns, g in ring.erased_generations() if ns == self.tenant]
            try:
                ids = {self._sealer.key_id(self.tenant, g)
                       for g in ring.generations(self.tenant) + erased}
            except InvalidSeal:  # no blinding secret: no key id of the tenant is known
                ids = set()
            self._explains = (self.tenant in ring.erasures(), frozenset(ids))
        whole_tenant, ids = self._explains
        return whole_tenant or bytes(PRE.unpack_from(head)[4]) in ids

    def host_opens(self, host: HostPool, slot: int) -> bool:
        """Whether ``slot``'s record still opens as far as its meta block (its key is live
        and it is this tenant's): ``contains`` agrees with ``get`` at the cost of one small
        AEAD open. A slot mid-write or empty counts as opening (``get`` keeps it too)."""
        try:
            record, _seq = host.view(slot)
        except (SlotEmpty, TornRead):
            return True
        try:
            self._meta(record, Tier.HOST)
        except InvalidSeal:
            return False
        return True

    def open_from_nvme(self, nvme: NvmeShard, key: bytes, scratch: np.ndarray,
                       out: np.ndarray | None) -> memoryview | Lookup:
        """Read ``key``'s record (verified by the shard) into ``scratch`` and open it into
        ``out`` (or a new buffer); MISS if the shard has none, or if it does not open
        (``out`` zeroed): sealed under an erased key (or not ours), it never opens again,
        so it leaves the shard."""
        nkey = self.nvme_key(key, nvme)
        loc = None if nkey is None else nvme.locate(nkey)[1]
        if loc is None:
            return Lookup.MISS
        record = nvme.get(nkey, _room(scratch, loc.length))  # larger: written with larger slots
        if record is Lookup.MISS:
            return Lookup.MISS
        try:
            return self.open(key, Tier.NVME, record, out)
        except InvalidSeal:
            nvme.delete(nkey)
            return Lookup.MISS

    def open_from_host(self, host: HostPool, slot: int, key: bytes, out: np.ndarray | None
                       ) -> memoryview | Lookup:
        """Open ``slot``'s record where it lies into ``out`` (or a new buffer), again if a
        writer changed the slot meanwhile; MISS if it holds no whole record. ``InvalidSeal``
        if it does not open."""
        for _ in range(_TORN_RETRIES):
            try:
                record, seq = host.view(slot)
            except (SlotEmpty, TornRead):
                return Lookup.MISS
            opened = self.open(key, Tier.HOST, record, out)
            if host.unchanged(slot, seq):
                return opened
        return Lookup.MISS


def _room(scratch: np.ndarray, n: int) -> np.ndarray:
    """``n`` bytes of ``scratch``, or of a new buffer when it is smaller (pages of an
    ``np.empty`` are only mapped where written)."""
    return scratch[:n] if n <= scratch.shape[0] else np.empty(n, np.uint8)


def survey(nvme: NvmeShard, seal: TenantSeal | None, scratch: np.ndarray
           ) -> dict[bytes, RecordKind]:
    """What each record of ``nvme`` is, for ``open_plan``: to ``seal``'s tenant, or (None)
    to an unsealed store, which reads only the heads of 32-byte keys (a sealed record is
    stored under its slot identity). Reads record heads; changes nothing."""
    head = memoryview(bytearray(HEAD_BYTES))
    kinds = {}
    if seal is not None:
        seal._explains = None  # what the keyring records now
    keys = nvme.keys()
    for nkey in keys:
        if seal is None and len(nkey) != SLOT_ID_BYTES:
            kinds[nkey] = RecordKind.PLAIN
            continue
        loc = nvme.locate(nkey)[1]
        read = Lookup.MISS if loc is None else nvme.read_head(nkey, head)
        got = None if read is Lookup.MISS else read
        if seal is not None:
            kind = seal.kind(nkey, got, 0 if loc is None else loc.length, scratch)
            if kind is RecordKind.UNKNOWN and not _intact(nvme, nkey, loc, scratch):
                kind = RecordKind.DEAD  # damaged bytes, not a stranger's: goes as today
            kinds[nkey] = kind
        elif got is not None and looks_sealed(nkey, got):
            kinds[nkey] = RecordKind.SEALED
        else:
            kinds[nkey] = RecordKind.PLAIN
    return kinds


def _intact(nvme: NvmeShard, nkey: bytes, loc: Any, scratch: np.ndarray) -> bool:
    """Whether ``nkey``'s whole record reads back and matches its payload hash (read-only:
    unlike ``NvmeShard.get``, a mismatch retires nothing)."""
    buf = memoryview(_room(scratch, loc.length))
    return nvme.read_head(nkey, buf) is not Lookup.MISS and \
        fmt.payload_digest(buf, loc.version) == loc.checksum
