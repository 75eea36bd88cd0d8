"""What each part of the service overwrote or forgot for a tenant erasure: the figures an
erasure receipt sums (``erasure.py``). Plain records (no Ray, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class TenantForgotten:
    """What the controller dropped of an erased tenant."""

    keys: dict[str, list[bytes]]  # per HBM actor: every key of the tenant's pages there
    pages: int
    resident: int  # pages that had a working copy in HBM
    sessions: int
    pins: int  # pins held on the tenant's pages (loads prepared and not released)
    cancelled: int  # scheduled gap migrations and prefetches of its pages
    straggling: int  # pages whose transfer had not ended when the wait gave up


@dataclass(frozen=True, kw_only=True)
class HbmPurged:
    """What an HBM actor overwrote for a tenant erasure (``HbmActor.purge``)."""

    pages: int  # the tenant's pages, freed and zeroed
    free_zeroed: int  # free arena pages zeroed (a dropped page keeps its bytes until reused)
    staging_zeroed: int  # free staging slots zeroed


@dataclass(frozen=True, kw_only=True)
class PoolPurged:
    """What a pool actor overwrote for a tenant erasure (``PoolActor.purge_tenant``)."""

    copies: tuple[tuple[bytes, int], ...]  # (key, codec) of each copy overwritten
    host: int  # copies in host-pool slots, zeroed and freed
    nvme: int  # copies in the NVMe shard, zeroed in place, then tombstoned
    host_free_zeroed: int  # free host slots zeroed
    nvme_dead_zeroed: int  # dead NVMe records zeroed
    staging_zeroed: int


@dataclass(frozen=True, kw_only=True)
class ControllerErased:
    """The controller's part of a tenant erasure: what it forgot, its HBM actors' summed."""

    forgotten: TenantForgotten
    hbm_pages: int
    hbm_free_zeroed: int
    hbm_actors: int
