"""The head's directory watch after an outage (``DirectoryWatch``, pure: the probe and the
recovery step are plain callables, no Redis): the recovery step re-applies erasures to a
directory that may have come back from an older snapshot, so until that step has run
without an error the directory counts as down (``/readyz`` says it is recovering) and the
step is tried again on the next probe; a restart seen between two good probes calls it
too."""

from __future__ import annotations

from agentkv_cluster.runtime.directory_glue import Backoff
from agentkv_cluster.runtime.directory_watch import DirectoryWatch, ready
from store.directory.base import DirectoryUnavailable

RECOVERING = (False, "directory: reachable again, recovering from the outage")


class _Directory:
    """What the watch's callables see: whether Redis answers, whether it restarted, and the
    re-application of erasures (it fails while ``refuse`` is above zero)."""

    def __init__(self) -> None:
        self.up = True
        self.restart = False
        self.refuse = 0
        self.reapplied = 0

    def check(self) -> tuple[bool, str]:
        return self.up, "directory ok" if self.up else "directory unreachable: refused"

    def restarted(self) -> bool:
        seen, self.restart = self.restart, False
        return seen

    def reapply(self) -> int:
        if self.refuse:
            self.refuse -= 1
            raise DirectoryUnavailable("LOADING Redis is loading the dataset in memory")
        self.reapplied += 1
        return 0


def _watch(d: _Directory) -> DirectoryWatch:
    return DirectoryWatch(d.check, on_recover=d.reapply, interval_s=5.0,
                          backoff=Backoff(first_s=0.5, max_s=4.0), restarted=d.restarted)


def test_a_failed_recovery_step_keeps_the_directory_down_and_is_tried_again() -> None:
    d = _Directory()
    watch = _watch(d)
    embedded = object()  # reachable at once: only the watch decides
    assert watch.probe_once() == 5.0 and watch.up is True
    d.up = False
    assert watch.probe_once() == 0.5 and watch.outages == 1
    d.up, d.refuse = True, 2  # answers again, but the erasures cannot be re-applied yet
    assert watch.probe_once() == 1.0
    assert watch.up is False and watch.recoveries == 0 and d.reapplied == 0
    assert ready(embedded, watch) == RECOVERING
    assert watch.probe_once() == 2.0 and watch.up is False  # refused once more
    assert ready(embedded, watch) == RECOVERING
    assert watch.probe_once() == 5.0  # done at last: up, and ready from now on
    assert watch.up is True and watch.recoveries == 1 and d.reapplied == 1
    assert ready(embedded, watch) == (True, "directory ok")
    assert watch.outages == 1


def test_a_restart_between_two_good_probes_reapplies_the_erasures_once() -> None:
    d = _Directory()
    watch = _watch(d)
    assert watch.probe_once() == 5.0 and d.reapplied == 0
    d.restart = True  # came back with data, maybe an older snapshot's: no probe failed
    assert watch.probe_once() == 5.0
    assert d.reapplied == 1 and watch.outages == 1 and watch.recoveries == 1
    assert watch.probe_once() == 5.0 and d.reapplied == 1  # once per restart
    d.restart, d.refuse = True, 1  # this time the step fails: not up until it ran
    watch.probe_once()
    assert watch.up is False and d.reapplied == 1
    assert ready(object(), watch) == RECOVERING
    assert watch.probe_once() == 5.0 and watch.up is True and d.reapplied == 2
