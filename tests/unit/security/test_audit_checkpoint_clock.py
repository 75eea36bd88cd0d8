"""A log signed after every record (``checkpoint_every=1``, as the service opens it): a
thread that appends several records with one time taken before another thread's later
record is not a clock going back, checkpoint or not."""

from __future__ import annotations

import json
import threading

import pytest

from security.audit import AuditLog, verify_log
from security.signing import Verifier


def test_a_checkpoint_moved_up_to_another_threads_time_is_not_this_threads_clock(
        tmp_path, signer) -> None:
    """The service's audit thread writes the retired-page summaries it drained with one
    time, while an erasure or a denial appends from another thread. The checkpoint after
    the first summary took the other thread's later time as this thread's own clock, so
    the next summary was refused as "time went backwards" (the pass failed, logged)."""
    audit = AuditLog(tmp_path / "a.log", signer, checkpoint_every=1, fsync=False)
    audit.append("page_retired", {"n": 0}, 10.0)
    other = threading.Thread(target=audit.append, args=("access.denied", {"n": 1}, 20.0))
    other.start()
    other.join()
    for n in (2, 3, 4):  # one time for the whole pass, as drain_audit takes it
        audit.append("page_retired", {"n": n}, 10.0)
    with pytest.raises(ValueError, match="backwards"):  # this thread's clock still may not
        audit.append("page_retired", {"n": 5}, 9.0)
    audit.close(now=30.0)
    lines = [json.loads(line) for line in (tmp_path / "a.log").read_text().splitlines()]
    records = [rec for rec in lines if rec["kind"] == "page_retired"]
    assert [rec["data"]["n"] for rec in records] == [0, 2, 3, 4]
    times = [rec["time"] for rec in lines]
    assert times == sorted(times)
    assert verify_log(tmp_path / "a.log", Verifier(signer.public_raw())).ok
