"""Page identity: packing, a digest stable across processes, strict compatibility."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from agentkv_cluster.lifecycle.identity import IdentityError, PageIdentity

BASE = {
    "model_version": "smollm2-135m@q4_1", "adapter_version": "", "tokenizer_version": "tok-v3",
    "rope_config": "theta=100000;scale=1", "tenant": "acme", "session": "s1", "start": 0,
    "end": 256, "event_version": 7,
}
# one changed value per field
CHANGES = {
    "model_version": "smollm2-135m@q8_0",
    "adapter_version": "lora-a1",
    "tokenizer_version": "tok-v4",
    "rope_config": "theta=100000;scale=2",
    "tenant": "globex",
    "session": "s2",
    "start": 128,
    "end": 512,
    "event_version": 8,
}


def make(**over: object) -> PageIdentity:
    return PageIdentity(**{**BASE, **over})  # type: ignore[arg-type]


def test_changes_cover_every_field() -> None:
    assert set(CHANGES) == {f.name for f in dataclasses.fields(PageIdentity)}


def test_pack_roundtrip_and_layout() -> None:
    ident = make()
    raw = ident.pack()
    assert raw[:5] == b"AKVI\x01"
    assert PageIdentity.unpack(raw) == ident
    strings = sum(len(str(BASE[k]).encode()) + 2 for k in list(BASE)[:6])
    assert len(raw) == 5 + strings + 24


def test_unicode_roundtrip() -> None:
    ident = make(tenant="租户-α", session="会话")
    assert PageIdentity.unpack(ident.pack()) == ident


def test_identical_fields_are_compatible() -> None:
    assert make().compatible_with(make())
    assert make().mismatches(make()) == ()
    assert make().digest() == make().digest()


@pytest.mark.parametrize("name", list(CHANGES))
def test_any_changed_field_is_incompatible(name: str) -> None:
    a, b = make(), make(**{name: CHANGES[name]})
    assert not a.compatible_with(b)
    assert not b.compatible_with(a)
    assert a.mismatches(b) == (name,)
    assert a.digest() != b.digest()
    assert a.pack() != b.pack()


# pinned: a change here means every stored page's directory key changes
GOLDEN_DIGEST = "03b8bd91d8c04e30ce9bcbddba2b5e82f3f6d0abcea41c4b76bc7be7edcb82d9"


def test_digest_is_32_bytes_and_pinned() -> None:
    d = make().digest()
    assert len(d) == 32
    assert d.hex() == GOLDEN_DIGEST


_CHILD = """
from agentkv_cluster.lifecycle.identity import PageIdentity
import sys
print(PageIdentity(**eval(sys.argv[1])).digest().hex())
"""


def test_digest_stable_across_processes() -> None:
    # different hash seeds: the digest must not depend on Python's hash()
    outs = set()
    for seed in ("1", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, repr(BASE)], check=True, capture_output=True,
            text=True, env={"PYTHONHASHSEED": seed, "PATH": ""}, cwd=_repo_root(),
        ).stdout.strip()
        outs.add(out)
    assert outs == {GOLDEN_DIGEST}


def _repo_root() -> str:
    import agentkv_cluster

    return str(Path(agentkv_cluster.__file__).resolve().parent.parent)


@pytest.mark.parametrize(("over", "message"), [
    ({"start": 10, "end": 10}, "empty token range"),
    ({"start": 20, "end": 10}, "empty token range"),
    ({"start": -1}, "start must be an int"),
    ({"event_version": 2**64}, "event_version must be an int"),
    ({"end": True}, "end must be an int"),
    ({"tenant": ""}, "tenant must not be empty"),
    ({"model_version": ""}, "model_version must not be empty"),
    ({"session": 5}, "session must be str"),
    ({"rope_config": "x" * 70000}, "rope_config is longer"),
])
def test_invalid_identity_rejected(over: dict, message: str) -> None:
    with pytest.raises(IdentityError, match=message):
        make(**over)


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda b: b[:-1], "cannot unpack"),
    (lambda b: b + b"\x00", "trailing bytes"),
    (lambda b: b"XKVI" + b[4:], "bad magic"),
    (lambda b: b[:4] + b"\x02" + b[5:], "unsupported identity format 2"),
    (lambda b: b[:7], "truncated in model_version"),
    (lambda b: b"", "cannot unpack"),
])
def test_unpack_rejects_damaged_bytes(mutate, message: str) -> None:
    with pytest.raises(IdentityError, match=message):
        PageIdentity.unpack(mutate(make().pack()))


def test_identity_is_frozen() -> None:
    ident = make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ident.tenant = "other"  # type: ignore[misc]
