"""``retry_unavailable``: one directory step tried again across a short outage, within a
budget counted from its first attempt; on a fake clock, so nothing waits."""

from __future__ import annotations

import pytest

from store.directory.base import (
    CredentialsRefused,
    DirectoryAccessDenied,
    DirectoryUnavailable,
    ReadOnlyReplica,
)
from store.directory.retry import RetryWait, retry_unavailable


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def doubling(delay: float | None) -> float:  # GUARD_BACKOFF's shape: 0.5 s doubling to 5 s
    return 0.5 if delay is None else min(5.0, 2 * delay)


def flaky(failures: int, error: Exception, clock: FakeClock, cost_s: float = 0.0):
    """A step that fails ``failures`` times with ``error`` (each attempt costing ``cost_s``
    on the clock, as a socket timeout would), then answers 7."""
    calls = []

    def step() -> int:
        calls.append(clock.now)
        clock.now += cost_s
        if len(calls) <= failures:
            raise error
        return 7

    return step, calls


@pytest.mark.parametrize("failures, budget_s, slept", [
    (0, 60.0, []),
    (1, 60.0, [0.5]),
    (4, 60.0, [0.5, 1.0, 2.0, 4.0]),
    (6, 60.0, [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]),
])
def test_an_outage_shorter_than_the_budget_is_waited_out(failures, budget_s, slept) -> None:
    clock = FakeClock()
    step, calls = flaky(failures, DirectoryUnavailable("redis unreachable"), clock)
    waits: list[RetryWait] = []
    assert retry_unavailable(step, budget_s=budget_s, next_delay=doubling, on_wait=waits.append,
                             clock=clock, sleep=clock.sleep) == 7
    assert clock.slept == slept and len(calls) == failures + 1
    assert [w.delay_s for w in waits] == slept  # each wait told before it starts
    assert [w.attempt for w in waits] == list(range(1, failures + 1))
    assert [w.elapsed_s for w in waits] == [sum(slept[:i]) for i in range(failures)]


@pytest.mark.parametrize("budget_s, slept", [
    (0.0, []),  # one attempt
    (0.4, []),  # the first wait would end past the budget
    (3.5, [0.5, 1.0, 2.0]),  # 3.5 s waited; 4 s more would end at 7.5
    (60.0, [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0]),
])
def test_an_outage_longer_than_the_budget_raises_its_last_error(budget_s, slept) -> None:
    clock = FakeClock()
    errors = iter(DirectoryUnavailable(f"attempt {i}") for i in range(1, 100))

    def step() -> int:
        raise next(errors)

    with pytest.raises(DirectoryUnavailable) as raised:
        retry_unavailable(step, budget_s=budget_s, next_delay=doubling, clock=clock,
                          sleep=clock.sleep)
    assert clock.slept == slept and sum(slept) <= budget_s
    assert str(raised.value) == f"attempt {len(slept) + 1}"


def test_the_budget_counts_the_attempts_too() -> None:
    """Attempts that take time (a 2 s socket timeout each) count against the budget, as
    the service's erasure counts them: from the first attempt, not from the first wait."""
    clock = FakeClock()
    step, calls = flaky(99, DirectoryUnavailable("timeout"), clock, cost_s=2.0)
    with pytest.raises(DirectoryUnavailable):
        retry_unavailable(step, budget_s=10.0, next_delay=doubling, clock=clock,
                          sleep=clock.sleep)
    # attempts of 2 s at 0, 2.5, 5.5, 9.5 (waits 0.5, 1, 2); the fourth ends at 11.5
    assert [t - 100.0 for t in calls] == [0.0, 2.5, 5.5, 9.5] and clock.slept == [0.5, 1.0, 2.0]


@pytest.mark.parametrize("error", [
    CredentialsRefused("WRONGPASS"),  # a DirectoryUnavailable that waiting does not heal
    DirectoryAccessDenied("NOPERM"),
    ReadOnlyReplica("READONLY"),
    ValueError("a bug"),
], ids=type)
def test_other_errors_are_raised_at_once(error) -> None:
    clock = FakeClock()
    step, calls = flaky(1, error, clock)
    with pytest.raises(type(error)):
        retry_unavailable(step, budget_s=60.0, next_delay=doubling, clock=clock,
                          sleep=clock.sleep)
    assert len(calls) == 1 and clock.slept == []
