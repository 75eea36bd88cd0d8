"""Asking several parts of the service at once, under one deadline.

Readiness asks the controller and the directory; a metrics scrape asks the controller and
every pool. Asked one after another with a timeout each, one hung actor delays the answer
by that timeout, and N hung actors by N times it. ``PartAsker.ask`` starts every question
on a thread of its own and waits for all of them until one shared deadline; a part that
has not answered by then is reported ``LATE``, never left out.

A question still running from an earlier ask is not asked again: the next ask waits on that
same call and takes its answer once it has come. So a hung part holds one thread at most,
however often it is asked, and a call with side effects (the controller's
``metrics_since`` moves a cursor) is not repeated while it runs: asks made one after
another collect its answer once, the first ask to find it done.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Outcome(Enum):
    ANSWERED = "answered"
    FAILED = "failed"  # the call raised
    LATE = "late"  # no answer by the deadline (the call goes on; a later ask collects it)


@dataclass(frozen=True, kw_only=True)
class Answer:
    outcome: Outcome
    value: Any = None  # what the call returned (ANSWERED)
    error: BaseException | None = None  # what it raised (FAILED)

    @property
    def answered(self) -> bool:
        return self.outcome is Outcome.ANSWERED


class _Call:
    """One question on its own daemon thread."""

    def __init__(self, part: str, question: Callable[[], Any]) -> None:
        self.done = threading.Event()
        self.answer = Answer(outcome=Outcome.LATE)
        self._question = question
        threading.Thread(target=self._run, name=f"agentkv-ask-{part}", daemon=True).start()

    def _run(self) -> None:
        try:
            self.answer = Answer(outcome=Outcome.ANSWERED, value=self._question())
        except Exception as exc:  # noqa: BLE001 - handed to the asker as FAILED
            self.answer = Answer(outcome=Outcome.FAILED, error=exc)
        finally:
            self.done.set()


class PartAsker:
    """Asks named parts concurrently; at most one call per part is running at any time."""

    def __init__(self) -> None:
        self._running: dict[str, _Call] = {}  # only parts of the latest ask
        self._lock = threading.Lock()

    def ask(self, questions: Mapping[str, Callable[[], Any]],
            deadline_s: float) -> dict[str, Answer]:
        """The answer of every part in ``questions`` within ``deadline_s`` seconds of now.
        A part whose earlier call is still running is not asked again (its answer, when it
        comes, is this ask's or a later one's); a part no longer asked is forgotten."""
        end = time.monotonic() + deadline_s
        with self._lock:
            for part in [p for p in self._running if p not in questions]:
                del self._running[part]
            calls = {part: self._running.get(part) or _Call(part, question)
                     for part, question in questions.items()}
            self._running.update(calls)
        answers = {}
        for part, call in calls.items():
            call.done.wait(max(0.0, end - time.monotonic()))
            answers[part] = self._collect(part, call)
        return answers

    def forget(self, part: str) -> None:
        """Drop ``part``'s running call: its answer, when it comes, is thrown away."""
        with self._lock:
            self._running.pop(part, None)

    def _collect(self, part: str, call: _Call) -> Answer:
        if not call.done.is_set():
            return Answer(outcome=Outcome.LATE)
        with self._lock:
            if self._running.get(part) is call:
                del self._running[part]
        return call.answer
