"""Fair shares of pinned HBM: which pins give way when a tenant finds an HBM actor full.

A load pins its pages until the engine releases them (``PageTable.hold``). When one
tenant's loads fill an HBM actor with pins, another tenant's load could never get room:
``revocations`` decides which pins go, ``PageTable.revoke_pins`` applies the choice.
Pure: no clock, no page table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HeldPin:
    """A pin one session holds on a page of an HBM actor (``SessionState.pinned``)."""

    tenant: str
    session: str
    gid: int
    at: float  # when the session pinned it
    size: int  # budget bytes of the page (0: the page is gone)


def revocations(capacity: int, asker: str, tenants: Iterable[str],
                pins: Sequence[HeldPin]) -> list[HeldPin]:
    """``asker`` finds an HBM actor of ``capacity`` budget bytes full of pinned pages. If
    it holds no more than its fair share (``capacity`` over the tenants with a session
    there, ``tenants``, and itself), the oldest pins of every other tenant above that
    share go until that tenant is within it; none go otherwise. Returns them, oldest
    first."""
    held = dict.fromkeys(tenants, 0)
    for pin in pins:
        held[pin.tenant] = held.get(pin.tenant, 0) + pin.size
    share = capacity // max(1, len({*held, asker}))
    if held.get(asker, 0) > share:
        return []
    out = []
    for pin in sorted(pins, key=lambda p: (p.at, p.gid)):
        if pin.tenant != asker and held[pin.tenant] > share:
            out.append(pin)
            held[pin.tenant] -= pin.size
    return out
