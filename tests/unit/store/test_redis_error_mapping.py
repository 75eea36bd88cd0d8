"""Redis's refusals of every write become typed ``WritesRefused``, recognised by the reply's
error prefix (redis-py's class for ``OOM``/``READONLY``, the message's first word for
``MISCONF``), never by the same word further into a message. The replies are those a real
redis-server 7 sends (tests/integration/store/test_redis_directory_refusals.py makes them)."""

from __future__ import annotations

import pytest
from redis import exceptions as rexc

from store.directory.base import (
    DirectoryError,
    DirectoryFull,
    MissingEntry,
    PersistenceFailing,
    ReadOnlyReplica,
    WriteRefusal,
    WritesRefused,
)
from store.directory.redis_errors import as_directory_error, call

SCRIPT = " script: 8e5accb51ccd93a1f8ed1b307ce7f3005bd47e65, on @user_script:22."
MISCONF = ("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to "
           "persist to disk. Commands that may modify the data set are disabled")
READONLY = "You can't write against a read only replica."  # redis-py strips "READONLY "


@pytest.mark.parametrize("exc, kind, reason", [
    (rexc.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
     DirectoryFull, WriteRefusal.OUT_OF_MEMORY),
    (rexc.ReadOnlyError(READONLY), ReadOnlyReplica, WriteRefusal.READ_ONLY_REPLICA),
    (rexc.ReadOnlyError(READONLY + SCRIPT), ReadOnlyReplica, WriteRefusal.READ_ONLY_REPLICA),
    (rexc.ResponseError(MISCONF), PersistenceFailing, WriteRefusal.PERSISTENCE_FAILING),
    (rexc.ResponseError(MISCONF + SCRIPT), PersistenceFailing,
     WriteRefusal.PERSISTENCE_FAILING),
], ids=["oom", "readonly", "readonly-script", "misconf", "misconf-script"])
def test_each_refusal_of_every_write_has_its_class_and_reason(exc, kind, reason) -> None:
    error = as_directory_error(exc)
    assert type(error) is kind and isinstance(error, WritesRefused)
    assert error.reason is reason
    assert str(exc) in str(error)  # Redis's own words are kept for the operator


@pytest.mark.parametrize("message", [
    "Error running script: MISCONF in an argument",
    "ERR unknown command 'READONLY', with args beginning with:",
    "WRONGTYPE Operation against a key holding the wrong kind of value MISCONF",
])
def test_the_words_deeper_in_a_message_do_not_count(message) -> None:
    error = as_directory_error(rexc.ResponseError(message))
    assert type(error) is DirectoryError and str(error) == message


def test_call_raises_the_typed_refusal_with_redis_error_as_its_cause() -> None:
    def refused() -> None:
        raise rexc.ResponseError(MISCONF)

    with pytest.raises(PersistenceFailing) as raised:
        call(refused)
    assert isinstance(raised.value.__cause__, rexc.ResponseError)


def test_a_scripts_own_refusal_still_maps_by_its_tag() -> None:
    error = as_directory_error(rexc.ResponseError("AKV_MISSING no entry"))
    assert type(error) is MissingEntry and str(error) == "no entry"
