"""``/readyz`` of a running service: a verdict within a deadline, and which part is not ready.

The parts (the controller answers, the directory is reachable) are asked at once through a
``PartAsker`` and the verdict is made from what answered within ``READY_DEADLINE_S``; a hung
actor makes the service not ready within that deadline instead of holding the probe past
its timeout. From the moment the service begins to stop the answer is ``not ready:
stopping``, whatever the parts say, so Kubernetes stops routing before connections close.

Body: the verdict on the first line (``ready``, ``not ready: PART, ...`` or ``not ready:
stopping``), then one line per part.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from agentkv_cluster.runtime.part_asker import Answer, Outcome, PartAsker

READY_DEADLINE_S = 1.5  # well under the chart's 3 s readinessProbe timeout
STOPPING = "not ready: stopping"

# part -> its check: (ready, one line saying so, starting with the part's name)
Checks = Mapping[str, Callable[[], tuple[bool, str]]]


def verdict(answers: Mapping[str, Answer], deadline_s: float) -> tuple[bool, str]:
    """Ready when every part answered ready; the body names the parts that did not."""
    lines, failing = [], []
    for part, answer in answers.items():
        if answer.outcome is Outcome.ANSWERED:
            ok, line = answer.value
        elif answer.outcome is Outcome.FAILED:
            ok, line = False, f"{part}: {type(answer.error).__name__}: {answer.error}"
        else:
            ok, line = False, f"{part}: no answer within {deadline_s:g} s"
        lines.append(line)
        if not ok:
            failing.append(part)
    head = f"not ready: {', '.join(failing)}" if failing else "ready"
    return not failing, "\n".join([head, *lines])


class Readiness:
    """The ``ready`` callable of the metrics endpoint. ``checks`` is called on each probe
    for the parts to ask (the topology changes: a policy swap replaces the controller)."""

    def __init__(self, checks: Callable[[], Checks], stopping: threading.Event,
                 deadline_s: float = READY_DEADLINE_S) -> None:
        self.checks = checks
        self.stopping = stopping
        self.deadline_s = deadline_s
        self._asker = PartAsker()

    def __call__(self) -> tuple[bool, str]:
        if self.stopping.is_set():
            return False, STOPPING
        answers = self._asker.ask(self.checks(), self.deadline_s)
        if self.stopping.is_set():  # stop began while the parts were asked
            return False, STOPPING
        return verdict(answers, self.deadline_s)
