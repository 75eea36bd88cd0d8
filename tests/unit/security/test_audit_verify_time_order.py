"""``verify_log`` itself finds a record whose time goes back, in a chain that is
otherwise intact and signed (a log written by a broken or dishonest writer that holds the
signing key: a backdated ``erasure`` record). Control: the same log in time order verifies."""

from __future__ import annotations

import pytest

from security.audit_format import GENESIS, checkpoint_message, head_path, record_hash
from security.audit_verify import verify_log
from security.signing import Signer, Verifier, canonical_json


def _write_log(path, signer: Signer, times: list[float]) -> None:
    prev, lines = GENESIS, []
    for seq, t in enumerate(times):
        data = {"tenant": "acme", "i": seq}
        kind = "erasure" if seq == len(times) - 1 else "key.create"
        h = record_hash(seq, t, kind, data, prev)
        lines.append(canonical_json({"seq": seq, "time": t, "kind": kind, "data": data,
                                     "prev": prev, "hash": h}) + b"\n")
        prev = h
    path.write_bytes(b"".join(lines))
    sig = signer.sign(checkpoint_message(len(times), prev))
    head_path(path).write_bytes(
        canonical_json({"count": len(times), "head": prev, "sig": sig.hex()}) + b"\n")


@pytest.mark.parametrize("times, ok", [([100.0, 101.0, 102.0], True),
                                       ([100.0, 101.0, 50.0], False)])
def test_a_record_whose_time_goes_back_is_a_finding(tmp_path, times, ok) -> None:
    signer = Signer.generate()
    path = tmp_path / "audit.log"
    _write_log(path, signer, times)
    report = verify_log(path, Verifier(signer.public_raw()))
    assert report.ok is ok, report.problems
    if not ok:
        assert any("time goes backwards" in p for p in report.problems)
