"""A small tenant-facing cache over real tiers for the security integration tests.

Tiers: an in-process arena standing in for HBM (there is no GPU here; the store's
HBM arena is on CPU too), a real ``/dev/shm`` file mapped with mmap (host pool),
and real files (NVMe shard). The directory is a real ``redis-server`` reached
through per-tenant ACL users, with blinded keys. Requests carry a token, never
a tenant: the tenant is the verified principal's.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import redis

from security import redis_acl
from security.blinding import DirectoryBlinder
from security.errors import InvalidSeal
from security.isolation import directory_lookup, probe_entry
from security.keyring import PUBLIC_NAMESPACE, TenantKeyring
from security.principals import AccessPolicy, TokenIssuer
from security.sealing import TenantSealer, sealed_size
from store.types import Codec, Lookup, Tier

_LEN = struct.Struct("<I")


class RealTiers:
    """Fixed-size slots in three real places; each slot holds ``len ‖ sealed page``."""

    def __init__(self, root: Path, *, slots: int, slot_bytes: int) -> None:
        self.slots, self.slot_bytes = slots, slot_bytes
        self.hbm = np.zeros((slots, slot_bytes), dtype=np.uint8)
        self.shm_path = Path(f"/dev/shm/akv-sectest-{os.getpid()}-{os.urandom(4).hex()}")
        fd = os.open(self.shm_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, slots * slot_bytes)
            self.shm = mmap.mmap(fd, slots * slot_bytes)
        finally:
            os.close(fd)
        self.nvme_dir = root / "nvme"
        self.nvme_dir.mkdir(parents=True)

    def _nvme(self, slot: int) -> Path:
        return self.nvme_dir / f"slot-{slot:05d}.page"

    def write(self, tier: Tier, slot: int, sealed: bytes | memoryview) -> None:
        blob = _LEN.pack(len(sealed)) + bytes(sealed)
        if tier is Tier.HBM:
            self.hbm[slot, : len(blob)] = np.frombuffer(blob, dtype=np.uint8)
        elif tier is Tier.HOST:
            self.shm[slot * self.slot_bytes : slot * self.slot_bytes + len(blob)] = blob
        else:
            self._nvme(slot).write_bytes(blob)

    def read(self, tier: Tier, slot: int) -> bytes | None:
        if tier is Tier.HBM:
            blob = self.hbm[slot].tobytes()
        elif tier is Tier.HOST:
            blob = self.shm[slot * self.slot_bytes : (slot + 1) * self.slot_bytes]
        else:
            path = self._nvme(slot)
            blob = path.read_bytes() if path.exists() else b""
        if len(blob) < 4:
            return None
        (n,) = _LEN.unpack_from(blob)
        return blob[4 : 4 + n] if n else None

    def clear(self, tier: Tier, slot: int) -> None:
        if tier is Tier.HBM:
            self.hbm[slot] = 0
        elif tier is Tier.HOST:
            self.shm[slot * self.slot_bytes : (slot + 1) * self.slot_bytes] = bytes(self.slot_bytes)
        else:
            self._nvme(slot).unlink(missing_ok=True)

    def raw_bytes(self) -> bytes:
        """Everything every tier holds (to prove erased bytes are gone)."""
        files = b"".join(p.read_bytes() for p in sorted(self.nvme_dir.iterdir()))
        return self.hbm.tobytes() + bytes(self.shm) + files

    def close(self) -> None:
        self.shm.close()
        self.shm_path.unlink(missing_ok=True)


@dataclass
class SecureCache:
    """put/lookup by token; pages sealed into tiers; blinded entries in Redis."""

    keyring: TenantKeyring
    tiers: RealTiers
    issuer: TokenIssuer
    redis_port: int
    admin: redis.Redis
    policy: AccessPolicy = field(default_factory=AccessPolicy)
    owners: dict[tuple[Tier, int], str] = field(default_factory=dict)
    clients: dict[str, redis.Redis] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sealer = TenantSealer(self.keyring)
        self.blinder = DirectoryBlinder(self.keyring)
        self.next_slot = {tier: 0 for tier in Tier}

    def add_tenant(self, tenant: str) -> redis_acl.TenantAclUser:
        self.keyring.create_tenant(tenant)
        user = redis_acl.make_user(self.blinder.namespace(tenant))
        redis_acl.apply_users(self.admin, [user])
        self.clients[tenant] = redis.Redis(host="127.0.0.1", port=self.redis_port,
                                           username=user.username, password=user.password)
        return user

    def put(self, token: str, digest: bytes, tier: Tier, page: bytes, now: float,
            public: bool = False) -> int:
        principal = self.issuer.verify(token, now)
        tenant = PUBLIC_NAMESPACE if public else principal.tenant
        self.policy.check(principal, tenant, "write")
        generation = self.keyring.current_generation(tenant)
        slot = self.next_slot[tier]
        self.next_slot[tier] += 1
        assert sealed_size(len(page)) + 4 <= self.tiers.slot_bytes
        self.tiers.write(tier, slot, self.sealer.seal(tenant, digest, generation, tier, slot, page))
        self.owners[(tier, slot)] = tenant
        entry = probe_entry(tier=int(tier), codec=int(Codec.FULL), plaintext_len=len(page),
                            generation=generation, slot=slot)
        self.clients[tenant].set(self.blinder.directory_key(tenant, digest), entry)
        return slot

    def lookup(self, token: str, digest: bytes, now: float) -> tuple[Lookup, bytes | None]:
        principal = self.issuer.verify(token, now)
        for namespace in self.policy.lookup_namespaces(principal, digest):
            found = self._lookup_in(namespace, digest)
            if found[0] is Lookup.HIT:
                return found
        return Lookup.MISS, None

    def _lookup_in(self, tenant: str, digest: bytes) -> tuple[Lookup, bytes | None]:
        value = directory_lookup(self.clients[tenant], self.blinder, tenant, digest)
        if value is None:
            return Lookup.MISS, None
        entry = json.loads(value)
        tier, slot, generation = Tier(entry["tier"]), entry["loc"], entry["gen"]
        sealed = self.tiers.read(tier, slot)
        if sealed is None:
            return Lookup.MISS, None
        try:
            page = self.sealer.open(tenant, digest, generation, tier, slot, sealed)
        except InvalidSeal:
            return Lookup.MISS, None
        return Lookup.HIT, bytes(page)

    def tier_deleter(self, tier: Tier):
        def delete(scope) -> int:
            mine = [s for (t, s), owner in self.owners.items() if t is tier and owner == scope.tenant]
            for slot in mine:
                self.tiers.clear(tier, slot)
                del self.owners[(tier, slot)]
            return len(mine)

        return delete

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
