"""The API error each refusal of the controller is answered with: the front's one mapping.

The controller and the load path refuse with typed exceptions (``records``, ``loads``,
``guard``); the wire carries codes (``api.protocol.ErrorCode``). The mapping goes by class,
most specific first, never by the wording of a message; a refusal with no entry of its own
is the caller's bad input (``bad_args``).
"""

from __future__ import annotations

from agentkv_cluster.api.errors import (
    AccessDenied,
    InvalidArgument,
    NoRoom,
    NotFound,
    PageLost,
    ServiceError,
    Stopping,
    TenantErased,
)
from agentkv_cluster.runtime.guard import ServiceStopping, StillMoving
from agentkv_cluster.runtime.loads import RefusedBusy, RefusedForeign, RefusedPageLost
from agentkv_cluster.runtime.records import RefusedNotFound, RequestRefused
from agentkv_cluster.runtime.records import TenantErased as ErasedInController

REFUSALS = (ErasedInController, ServiceStopping, RequestRefused)  # what the front maps

_CODES: tuple[tuple[type[Exception], type[ServiceError]], ...] = (
    (ErasedInController, TenantErased),  # tenant_erased
    (ServiceStopping, Stopping),  # busy: retry on another instance
    (RefusedNotFound, NotFound),  # not_found
    (RefusedPageLost, PageLost),  # page_lost: recompute
    (RefusedBusy, NoRoom),  # busy: retry later
    (StillMoving, NoRoom),  # busy: a page still moves, retry later
    (RefusedForeign, AccessDenied),  # forbidden
)


def as_api_error(exc: Exception) -> ServiceError:
    """The API error for refusal ``exc`` (one of ``REFUSALS``), its message as written."""
    for kind, error in _CODES:
        if isinstance(exc, kind):
            return error(str(exc))
    return InvalidArgument(str(exc))
