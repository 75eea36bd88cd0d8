"""Asking parts at once under one deadline: a hung part is reported late, not waited for,
is not asked again while its call runs, and its answer is collected once."""

from __future__ import annotations

import threading
import time

from agentkv_cluster.runtime.part_asker import Outcome, PartAsker


class Part:
    def __init__(self, value: object = "ok", error: Exception | None = None) -> None:
        self.value, self.error, self.calls = value, error, 0
        self.release = threading.Event()
        self.release.set()

    def __call__(self) -> object:
        self.calls += 1
        self.release.wait(30.0)
        if self.error is not None:
            raise self.error
        return self.value


def test_every_part_is_answered_late_or_failed_within_one_deadline() -> None:
    hung, hung_too = Part(), Part()
    hung.release.clear()
    hung_too.release.clear()
    asker, started = PartAsker(), time.monotonic()
    got = asker.ask({"a": Part(1), "b": hung, "c": Part(error=KeyError("x")), "d": hung_too},
                    deadline_s=0.2)
    assert time.monotonic() - started < 0.2 + 2.0  # one deadline for all, not one each
    assert {p: a.outcome for p, a in got.items()} == {
        "a": Outcome.ANSWERED, "b": Outcome.LATE, "c": Outcome.FAILED, "d": Outcome.LATE}
    assert got["a"].value == 1 and isinstance(got["c"].error, KeyError)
    hung.release.set()
    hung_too.release.set()


def test_a_hung_part_is_not_asked_again_and_its_late_answer_is_collected_once() -> None:
    part, asker = Part("late"), PartAsker()
    part.release.clear()
    for _ in range(3):
        assert asker.ask({"p": part}, deadline_s=0.05)["p"].outcome is Outcome.LATE
    assert part.calls == 1
    part.release.set()
    first = asker.ask({"p": part}, deadline_s=5.0)["p"]
    assert (first.outcome, first.value, part.calls) == (Outcome.ANSWERED, "late", 1)
    assert asker.ask({"p": part}, deadline_s=5.0)["p"].answered and part.calls == 2


def test_a_forgotten_or_no_longer_asked_part_is_asked_afresh() -> None:
    old, new, asker = Part("old"), Part("new"), PartAsker()
    old.release.clear()
    asker.ask({"p": old}, deadline_s=0.05)
    asker.forget("p")
    assert asker.ask({"p": new}, deadline_s=5.0)["p"].value == "new"
    asker.ask({"q": old}, deadline_s=0.05)  # still hung
    asker.ask({"p": new}, deadline_s=5.0)  # q is no longer asked: dropped
    old.release.set()
    assert asker.ask({"q": new}, deadline_s=5.0)["q"].value == "new"
