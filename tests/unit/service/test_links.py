"""Typed transfer links: the two credit classes of a link are separate buckets, the
background one a quarter of the link's credits, and labels keep their old text."""

from __future__ import annotations

import pytest

from agentkv_cluster.policy.credits import CreditGrant
from agentkv_cluster.runtime.link_credits import Link, LinkCredits


def test_a_link_labels_itself_as_metrics_and_logs_always_showed_it() -> None:
    fg = Link("pool", "hbm0")
    bg = fg.as_background()
    assert (str(fg), str(bg)) == ("pool>hbm0", "pool>hbm0/bg")
    assert bg.background and not fg.background
    assert bg.foreground == fg and fg.foreground is fg and bg.as_background() is bg
    assert bg != fg and len({fg, bg, Link("pool", "hbm0")}) == 2
    assert Link("pool", "hbm1") != fg  # the HBM actor is part of the link


@pytest.mark.parametrize("per_link", [1, 3, 4, 8, 13])
def test_background_has_its_own_bucket_of_a_quarter_of_the_link(per_link: int) -> None:
    credits = LinkCredits(per_link=per_link, per_session=100)
    link = Link("pool", "hbm0")
    bg = link.as_background()
    cap = max(1, per_link // 4)
    held: list[tuple[Link, CreditGrant | None]] = []
    # The background class takes exactly its quarter (at least one) ...
    for i in range(cap):
        held.append((bg, credits.acquire(f"b{i}", bg, timeout_s=2.0)))
    with pytest.raises(TimeoutError, match="pool>hbm0/bg"):
        credits.acquire("b-extra", bg, timeout_s=0.1)
    # ... and none of it comes out of the foreground bucket: with the background class
    # full, every one of the link's credits is still there for an engine's restores.
    for i in range(per_link):
        held.append((link, credits.acquire(f"f{i}", link, timeout_s=2.0)))
    with pytest.raises(TimeoutError, match=r"pool>hbm0 after"):
        credits.acquire("f-extra", link, timeout_s=0.1)
    assert credits.in_flight == {bg: cap, link: per_link}
    assert credits.max_in_flight == {bg: cap, link: per_link}
    for which, grant in held:
        credits.release(which, grant)
    assert sum(credits.in_flight.values()) == 0
    assert sum(credits.waiting.values()) == 0


def test_links_of_other_hbm_actors_keep_their_own_credits() -> None:
    credits = LinkCredits(per_link=1, per_session=4)
    a, b = Link("pool", "hbm0"), Link("pool", "hbm1")
    ga = credits.acquire("s", a, timeout_s=1.0)
    gb = credits.acquire("s", b, timeout_s=1.0)  # hbm0's full link does not hold it up
    credits.release(a, ga)
    credits.release(b, gb)
    assert credits.max_in_flight == {a: 1, b: 1}
