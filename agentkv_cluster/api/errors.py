"""Exceptions a service backend raises; the wire server maps each to one error code."""

from __future__ import annotations

from agentkv_cluster.api.protocol import ErrorCode


class ServiceError(Exception):
    """Base: a request the service refuses; nothing was changed."""

    code = ErrorCode.INTERNAL


class InvalidArgument(ServiceError):
    code = ErrorCode.BAD_ARGS


class NotFound(ServiceError):
    code = ErrorCode.NOT_FOUND


class AccessDenied(ServiceError):
    code = ErrorCode.FORBIDDEN


class Unauthenticated(ServiceError):
    code = ErrorCode.UNAUTHENTICATED


class Stopping(ServiceError):
    """The service is stopping: the request was refused and changed nothing; retry on
    another instance."""

    code = ErrorCode.BUSY


class NoRoom(ServiceError):
    """The service has no room for the request now: the HBM is full of pinned pages, or a
    pool's tiers are full. Nothing was changed; retry later (or release pages)."""

    code = ErrorCode.BUSY


class TenantErased(ServiceError):
    """The tenant was erased while the request ran (or is being erased): nothing of it
    was served. A token issued after the erasure starts the tenant again, empty."""

    code = ErrorCode.TENANT_ERASED


class PageLost(ServiceError):
    """Not the caller's fault: a page the request needs has no usable copy left (its HBM
    actor died with its only copy, or its copies could not be brought back into HBM), or
    the pages of a store did not outlive the HBM actors that took them. Nothing is held
    for the request; the client recomputes the pages and stores them again."""

    code = ErrorCode.PAGE_LOST


class TenantNotProvisioned(ServiceError):
    """The tenant has no keys and the key directory cannot create them (read-only Secret)."""

    code = ErrorCode.FORBIDDEN

    def __init__(self, tenant: str) -> None:
        super().__init__(f"tenant {tenant!r} is not provisioned: no keys in the (read-only) "
                         "tenant key directory; create them with `agentkv tenant create`")
        self.tenant = tenant
