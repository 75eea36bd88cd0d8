"""``/readyz`` verdicts: which part is not ready, a hung part within the deadline, and
"stopping" from the moment stop begins whatever the parts say."""

from __future__ import annotations

import threading
import time

from agentkv_cluster.runtime.part_asker import Answer, Outcome
from agentkv_cluster.runtime.readiness import STOPPING, Readiness, verdict


def test_the_verdict_names_each_part_that_is_not_ready() -> None:
    ok = Answer(outcome=Outcome.ANSWERED, value=(True, "controller ok"))
    down = Answer(outcome=Outcome.ANSWERED, value=(False, "directory unreachable: X"))
    late = Answer(outcome=Outcome.LATE)
    failed = Answer(outcome=Outcome.FAILED, error=OSError("boom"))
    cases = [
        ({"controller": ok}, (True, "ready\ncontroller ok")),
        ({"controller": ok, "directory": down},
         (False, "not ready: directory\ncontroller ok\ndirectory unreachable: X")),
        ({"controller": late, "directory": failed},
         (False, ("not ready: controller, directory\ncontroller: no answer within 1.5 s\n"
                  "directory: OSError: boom"))),
    ]
    for answers, want in cases:
        assert verdict(answers, 1.5) == want


def test_a_hung_part_makes_the_service_not_ready_within_the_deadline() -> None:
    release = threading.Event()

    def hung() -> tuple[bool, str]:
        release.wait(30.0)
        return True, "controller ok"

    ready = Readiness(lambda: {"controller": hung, "directory": lambda: (True, "directory ok")},
                      threading.Event(), deadline_s=0.2)
    started = time.monotonic()
    assert ready() == (False, ("not ready: controller\ncontroller: no answer within 0.2 s\n"
                               "directory ok"))
    assert time.monotonic() - started < 0.2 + 2.0
    release.set()
    assert ready() == (True, "ready\ncontroller ok\ndirectory ok")


def test_stopping_is_not_ready_whatever_the_parts_say() -> None:
    stopping, asked = threading.Event(), []

    def checks() -> dict:
        asked.append(1)
        stopping.set()  # stop begins while the parts are asked
        return {"controller": lambda: (True, "controller ok")}

    ready = Readiness(checks, stopping, deadline_s=1.0)
    assert ready() == (False, STOPPING)
    assert ready() == (False, STOPPING) and len(asked) == 1  # no part asked once stopping
