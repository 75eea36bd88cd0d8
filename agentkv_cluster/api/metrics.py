"""Prometheus metrics of the service and the HTTP endpoint that serves them.

Every metric is listed, with its type, labels and meaning, in ``docs/metrics.md``.

Label cardinality is bounded: the first ``top_tenants`` tenants seen since start keep a
label of their own, every later tenant is counted under ``"_other"`` (a label never moves to
another tenant, so series stay continuous; no tenant name starts with ``_`` and the one
namespace that does is ``_public``, so the overflow bucket cannot be taken for a tenant);
tiers, sources and operations come from closed sets. Tenants are labelled by a stable blinded id (``t-`` + 12 hex digits, a keyed hash of
the name) unless the operator opts in to names (``metrics.tenant_names``); an erased
tenant's series are removed. ``/healthz`` says the process is alive, ``/readyz`` runs a
readiness callback (``runtime.readiness``), ``/metrics`` is the exposition.
"""

from __future__ import annotations

import hashlib
import platform
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from store.directory.base import WriteRefusal

if TYPE_CHECKING:  # the service hands its loads' phases in; no import at run time
    from agentkv_cluster.runtime.records import LoadPhases

# The overflow label: neither a tenant name (``security.keyring``: ``[a-z0-9][a-z0-9_-]*``)
# nor the PUBLIC namespace (``_public``), so under ``metrics.tenant_names`` a tenant called
# "other" keeps a label of its own instead of merging into the overflow bucket.
OTHER = "_other"
RESTORE_SOURCES = ("hbm", "host", "nvme", "remote", "recompute")
ERASURE_RESULTS = ("ok", "failed")  # agentkv_erasures{result}: no tenant label, never removed
DELAY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                   10, 30)


def blinded_tenant(tenant: str, key: bytes) -> str:
    """A stable label for ``tenant`` that does not name it: ``t-`` + 12 hex digits of a keyed
    BLAKE2b (same key, same id across restarts; without the key the name cannot be tested)."""
    digest = hashlib.blake2b(tenant.encode(), key=key[:64], person=b"akv-metrics",
                             digest_size=6).hexdigest()
    return f"t-{digest}"


class TenantLabels:
    """Maps tenants to at most ``top_n`` distinct labels plus ``OTHER``: the first
    ``top_n`` tenants seen since start keep theirs. ``key`` blinds the labels (None: names)."""

    def __init__(self, top_n: int, key: bytes | None = None) -> None:
        self.top_n = top_n
        self.key = key
        self._known: dict[str, str] = {}  # tenant -> label
        self._lock = threading.Lock()

    def _label(self, tenant: str) -> str:
        return tenant if self.key is None else blinded_tenant(tenant, self.key)

    def __call__(self, tenant: str) -> str:
        with self._lock:
            label = self._known.get(tenant)
            if label is not None:
                return label
            if len(self._known) < self.top_n and tenant != OTHER:
                label = self._known[tenant] = self._label(tenant)
                return label
        return OTHER

    def has_own(self, tenant: str) -> bool:
        """Whether ``tenant`` was given a label of its own (even if erased since): at most
        ``top_n`` tenants ever are."""
        with self._lock:
            return tenant in self._known

    def forget(self, tenant: str) -> str | None:
        """Drop ``tenant`` (erased): its label, if it had one (the slot is not reused)."""
        with self._lock:
            label = self._known.get(tenant)
            if label is not None:
                self._known[tenant] = OTHER
            return label


class ServiceMetrics:
    """Every metric the service exports, in one private registry."""

    def __init__(self, top_tenants: int = 20, *, label_key: bytes | None = None,
                 tenant_names: bool = False, version: str | None = None) -> None:
        """``label_key`` blinds tenant labels (the service passes its token secret, so ids
        are stable across restarts); without one a random key is used unless
        ``tenant_names``."""
        import secrets

        self.registry = CollectorRegistry()
        key = None if tenant_names else (label_key or secrets.token_bytes(32))
        self.tenant = TenantLabels(top_tenants, key)
        r = self.registry
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes
        PlatformCollector(registry=r)  # python_info
        Info("agentkv_build", "Version of the running service", registry=r).info(
            {"version": version or _version(), "python": platform.python_version()})
        self.restore_delay = Histogram(
            "agentkv_restore_delay_seconds", "Visible restore delay by source",
            ["tenant", "source"], buckets=DELAY_BUCKETS, registry=r)
        self.hidden_fraction = Gauge(
            "agentkv_hidden_fraction", "Fraction of restore work hidden in tool gaps since "
            "start (prefer the rate of the two seconds counters)", ["tenant"], registry=r)
        self.restore_hidden_seconds = Counter(
            "agentkv_restore_hidden_seconds", "Restore work overlapped with tool gaps",
            ["tenant"], registry=r)
        self.restore_seconds = Counter(
            "agentkv_restore_seconds", "Restore work, hidden plus visible", ["tenant"],
            registry=r)
        self.transfer_bytes = Counter(
            "agentkv_transfer_bytes", "Bytes moved into a tier", ["tenant", "tier"], registry=r)
        self.pages_by_codec = Counter(
            "agentkv_pages_compressed", "Page copies written to the pool tiers, per "
            "compression level", ["tenant", "codec"], registry=r)
        self.prefetch_gave_room = Counter(
            "agentkv_prefetch_gave_room", "Prefetches that handed their HBM room back to an "
            "engine load blocked for room (the page stays in the pool)", registry=r)
        self.verification_rejects = Counter(
            "agentkv_verification_rejects", "Restores rejected by verification or seal",
            ["pool"], registry=r)
        self.nvme_full_stores = Counter(
            "agentkv_nvme_full_stores", "Pool stores that found the NVMe tier full (file "
            "system or pool.nvme_bytes), by outcome (spilled: placed in a free host slot "
            "instead; refused: no host slot either, nothing stored)", ["pool", "outcome"],
            registry=r)
        self.nvme_reserve = Gauge(
            "agentkv_nvme_reserve_bytes", "Bytes a pool's NVMe shard holds back in its space "
            "reserve (so that deletions, erasures and compaction land on a full file system)",
            ["pool"], registry=r)
        self.nvme_reserve_target = Gauge(
            "agentkv_nvme_reserve_target_bytes", "Bytes that reserve holds when full; more "
            "than agentkv_nvme_reserve_bytes once a full file system has drawn on it",
            ["pool"], registry=r)
        self.lossy_loads = Counter(
            "agentkv_lossy_load_pages", "Lossy working copies handed out by complete_load, by "
            "outcome (reference: replaced by the FULL reference copy; lossy: no reference, "
            "served as is for the engine to verify or recompute)", ["tenant", "outcome"],
            registry=r)
        self.verify_seconds = Counter(
            "agentkv_verify_seconds", "Time spent fetching FULL references of lossy working "
            "copies at complete_load", ["tenant"], registry=r)
        self.recompute_tokens = Counter(
            "agentkv_recompute_tokens", "Tokens the engine must re-prefill", ["tenant"], registry=r)
        self.lookup_pages = Counter(
            "agentkv_prefix_lookup_pages", "Pages asked for by prefix lookups, by result",
            ["tenant", "result"], registry=r)
        self.lookup_tokens = Counter(
            "agentkv_prefix_lookup_tokens", "Tokens asked for by prefix lookups, by result",
            ["tenant", "result"], registry=r)
        self.credit_wait = Histogram(
            "agentkv_credit_wait_seconds", "Time a move waited for link credit, by the "
            "tier it moves into (restores into hbm, gap migrations into host and nvme)",
            ["tier"], buckets=DELAY_BUCKETS, registry=r)
        self.load_phase = Histogram(
            "agentkv_load_phase_seconds", "Where engine loads spent their time, by phase: "
            "settle (pages being moved out), blocked (no room: HBM full of pins), transfer "
            "(the load's own demotions and restores), arrival (pages already coming in), "
            "total", ["phase"], buckets=DELAY_BUCKETS, registry=r)
        self.occupancy = Gauge(
            "agentkv_tier_occupancy_bytes", "Bytes resident per tier", ["tier"], registry=r)
        self.capacity = Gauge(
            "agentkv_tier_capacity_bytes", "Configured bytes per tier", ["tier"], registry=r)
        self.api_requests = Counter(
            "agentkv_api_requests", "Wire requests by op and result", ["op", "code"], registry=r)
        self.request_duration = Histogram(
            "agentkv_request_duration_seconds", "Wire request handling time by op",
            ["op"], buckets=REQUEST_BUCKETS, registry=r)
        self.directory_up = Gauge(
            "agentkv_directory_up", "1 while the directory (Redis) answers, 0 during an outage",
            registry=r)
        self.directory_up.set(1)
        self.directory_refuses_writes = Gauge(
            "agentkv_directory_refuses_writes", "1 while the directory (Redis) answers reads "
            "but refuses writes, by reason (out_of_memory: maxmemory reached; "
            "read_only_replica: the URL names a replica; persistence_failing: its snapshots "
            "fail, MISCONF), else 0",
            ["reason"], registry=r)
        self.set_directory_refusal(None)  # every reason's series from 0
        self.erasures = Counter(
            "agentkv_erasures", "Tenant erasures run by the service, by result (failed: keys "
            "destroyed but a tier's pages could not be deleted)", ["result"], registry=r)
        for result in ERASURE_RESULTS:  # both series from 0: increase() sees the first failure
            self.erasures.labels(result=result)
        self.scrape_part_ok = Gauge(
            "agentkv_scrape_part_ok", "1 if the part (controller, pool/NAME) answered the "
            "last scrape within its deadline, 0 if not: its figures are from an earlier "
            "scrape", ["part"], registry=r)
        self._tenant_metrics = (self.restore_delay, self.hidden_fraction,
                                self.restore_hidden_seconds, self.restore_seconds,
                                self.transfer_bytes, self.pages_by_codec, self.recompute_tokens,
                                self.lossy_loads, self.verify_seconds,
                                self.lookup_pages, self.lookup_tokens)
        self._hidden: dict[str, list[float]] = {}  # tenant label -> [hidden s, total s]
        self._lock = threading.Lock()

    def api_request(self, op: str, code: str, seconds: float | None = None) -> None:
        self.api_requests.labels(op=op, code=code).inc()
        if seconds is not None:
            self.request_duration.labels(op=op).observe(seconds)

    def restore(self, tenant: str, source: str, delay_s: float, hidden_s: float) -> None:
        """One restore: ``delay_s`` visible to the engine, ``hidden_s`` overlapped with a gap."""
        if source not in RESTORE_SOURCES:
            raise ValueError(f"unknown restore source {source!r}")
        label = self.tenant(tenant)
        self.restore_delay.labels(tenant=label, source=source).observe(delay_s)
        self.restore_hidden_seconds.labels(tenant=label).inc(hidden_s)
        self.restore_seconds.labels(tenant=label).inc(hidden_s + delay_s)
        with self._lock:
            acc = self._hidden.setdefault(label, [0.0, 0.0])
            acc[0] += hidden_s
            acc[1] += hidden_s + delay_s
            frac = acc[0] / acc[1] if acc[1] > 0 else 0.0
        self.hidden_fraction.labels(tenant=label).set(frac)

    def lookup(self, tenant: str, hit_pages: int, miss_pages: int, hit_tokens: int,
               miss_tokens: int) -> None:
        """One prefix lookup: the leading run found (hit) and the rest (miss)."""
        label = self.tenant(tenant)
        self.lookup_pages.labels(tenant=label, result="hit").inc(hit_pages)
        self.lookup_pages.labels(tenant=label, result="miss").inc(miss_pages)
        self.lookup_tokens.labels(tenant=label, result="hit").inc(hit_tokens)
        self.lookup_tokens.labels(tenant=label, result="miss").inc(miss_tokens)

    def transfer(self, tenant: str, tier: str, nbytes: int) -> None:
        self.transfer_bytes.labels(tenant=self.tenant(tenant), tier=tier).inc(nbytes)

    def stored(self, tenant: str, codec: str, pages: int = 1) -> None:
        self.pages_by_codec.labels(tenant=self.tenant(tenant), codec=codec).inc(pages)

    def gave_room(self, n: int) -> None:
        self.prefetch_gave_room.inc(n)

    def reject(self, pool: str, n: int = 1) -> None:
        """Restores a pool refused: failed seal (AES-GCM tag) or digest check."""
        self.verification_rejects.labels(pool=pool).inc(n)

    def nvme_full(self, pool: str, spilled: int, refused: int) -> None:
        """Stores a pool placed in a host slot for want of NVMe room, and those it refused."""
        self.nvme_full_stores.labels(pool=pool, outcome="spilled").inc(spilled)
        self.nvme_full_stores.labels(pool=pool, outcome="refused").inc(refused)

    def set_nvme_reserves(self, reserves: Mapping[str, tuple[int, int]]) -> None:
        """Each pool's NVMe space reserve, (held, when full), by pool; the series of pools
        no longer there go."""
        for gauge in (self.nvme_reserve, self.nvme_reserve_target):
            _keep_only(gauge, "pool", reserves)
        for pool, (held, target) in reserves.items():
            self.nvme_reserve.labels(pool=pool).set(held)
            self.nvme_reserve_target.labels(pool=pool).set(target)

    def verify(self, tenant: str, exact: bool, seconds: float) -> None:
        """One lossy working copy at complete_load: replaced by its FULL reference (exact)
        or served lossy (no reference), and the time the reference fetch took."""
        label = self.tenant(tenant)
        self.lossy_loads.labels(tenant=label, outcome="reference" if exact else "lossy").inc()
        self.verify_seconds.labels(tenant=label).inc(seconds)

    def recompute(self, tenant: str, tokens: int) -> None:
        self.recompute_tokens.labels(tenant=self.tenant(tenant)).inc(tokens)

    def waited(self, tier: str, seconds: float) -> None:
        """One credit wait on the link into ``tier``."""
        self.credit_wait.labels(tier=tier).observe(seconds)

    def loaded(self, phases: LoadPhases) -> None:
        """One engine load's phases (``runtime.records.LoadPhases``)."""
        for phase, seconds in zip(phases.PHASES, phases.seconds()):
            self.load_phase.labels(phase=phase).observe(seconds)

    def set_occupancy(self, tier: str, nbytes: int) -> None:
        self.occupancy.labels(tier=tier).set(nbytes)

    def set_capacity(self, tier: str, nbytes: int) -> None:
        self.capacity.labels(tier=tier).set(nbytes)

    def set_scrape_parts(self, answered: Mapping[str, bool]) -> None:
        """Which parts answered this scrape; the series of parts no longer asked go."""
        _keep_only(self.scrape_part_ok, "part", answered)
        for part, ok in answered.items():
            self.scrape_part_ok.labels(part=part).set(1 if ok else 0)

    def set_directory_up(self, up: bool) -> None:
        self.directory_up.set(1 if up else 0)

    def set_directory_refusal(self, refusal: WriteRefusal | None) -> None:
        """Why the directory refuses writes now (None: it does not, or cannot be reached)."""
        for reason in WriteRefusal:
            self.directory_refuses_writes.labels(reason=reason.value).set(
                1 if reason is refusal else 0)

    def erased(self, tenant: str, failed: bool) -> None:
        """A tenant erasure finished: count it and stop naming the tenant."""
        self.erasures.labels(result="failed" if failed else "ok").inc()
        self.forget_tenant(tenant)

    def forget_tenant(self, tenant: str) -> None:
        """Remove every series labelled with ``tenant`` (erased tenants are not named)."""
        label = self.tenant.forget(tenant)
        if label is None or label == OTHER:
            return
        with self._lock:
            self._hidden.pop(label, None)
        for metric in self._tenant_metrics:
            for labels in [ls for ls in _label_sets(metric) if ls.get("tenant") == label]:
                metric.remove(*[labels[n] for n in metric._labelnames])

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _keep_only(gauge: Gauge, label: str, keep: Mapping[str, object]) -> None:
    """Remove the series of a one-label gauge whose ``label`` value is not in ``keep``."""
    for labels in _label_sets(gauge):
        if labels[label] not in keep:
            gauge.remove(labels[label])


def _label_sets(metric: object) -> list[dict[str, str]]:
    names = metric._labelnames  # type: ignore[attr-defined]
    with metric._lock:  # type: ignore[attr-defined]
        keys = list(metric._metrics)  # type: ignore[attr-defined]
    return [dict(zip(names, k)) for k in keys]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agentkv-cluster")
    except PackageNotFoundError:
        return "unknown"


# The endpoint lives in its own module; imported here, where callers have always found it.
from agentkv_cluster.api.metrics_http import MetricsHttpServer

__all__ = ["MetricsHttpServer", "ServiceMetrics", "TenantLabels", "blinded_tenant"]
